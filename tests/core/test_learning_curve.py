"""The curve `rose run` prints at its end: sparklines, bucketing, and the same lines from dataclasses or JSON."""

from __future__ import annotations

import json
import math

import pytest

from rose_core.app.jobs.step_report import StepReport
from rose_core.app.run.learning_curve import MAX_POINTS, bucket_means, learning_curve
from rose_core.app.run.run_report import RunReport
from rose_core.support.sparkline import BLOCKS, sparkline


def step(n: int, reward: float, success: float, eval_success: float | None = None) -> StepReport:
    return StepReport(
        step=n, weight_version=n, trajectories=8, turns_dedicated=6, turns_serving=2, reward_mean=reward,
        rollout_seconds=2.0 + n, train_seconds=0.5, sync_seconds=0.25, sync_bytes=10, serving_requests=0,
        serving_ttft_p99_ms=0.0, serving_tpot_p99_ms=0.0, serving_slo_violations=0, success_rate=success,
        eval_success=eval_success,
    )


def test_sparkline_scales_from_lowest_to_highest_block() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([3.0, 1.0, 2.0]) == "█▁▅"
    assert sparkline([]) == ""


def test_sparkline_missing_values_constant_series_and_bounds() -> None:
    assert sparkline([0.0, None, 1.0]) == "▁ █"
    assert sparkline([None, None]) == "  "
    assert sparkline([2.0, 2.0, 2.0]) == "▄▄▄"
    assert sparkline([0.0, 0.5], bounds=(0.0, 1.0)) == "▁▅"
    assert sparkline([-1.0, 2.0], bounds=(0.0, 1.0)) == "▁█"  # clipped to the bounds
    assert set(sparkline([float(i) for i in range(100)])) == set(BLOCKS)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_sparkline_rejects_nan_naming_the_fix(bad: float) -> None:
    with pytest.raises(ValueError, match=r"value 1 is .*pass None for a missing value"):
        sparkline([1.0, bad])


def test_bucket_means_keep_short_series_and_average_long_ones() -> None:
    assert bucket_means([1.0, None, 3.0], points=5) == [1.0, None, 3.0]
    assert bucket_means([1.0, 3.0, 5.0, 7.0], points=2) == [2.0, 6.0]
    assert bucket_means([None, None, 4.0, 6.0], points=2) == [None, 5.0]
    assert len(bucket_means([0.0] * 1000)) == MAX_POINTS
    with pytest.raises(ValueError, match="points >= 1"):
        bucket_means([1.0], points=0)


def test_curve_lines_show_the_trend_of_reward_and_success() -> None:
    steps = [step(n, -0.5 + 0.1 * n, n / 9) for n in range(10)]
    lines = learning_curve(steps)
    assert lines[0] == "learning curve, 10 steps (one mark per step):"
    reward, success = lines[1], lines[2]
    assert reward.split()[:2] == ["reward", "▁▂▃▃▄▅▆▆▇█"]
    assert "-0.500 -> +0.400" in reward
    assert "first 5 mean -0.300 -> last 5 +0.200 (+0.500)" in reward
    assert success.split()[:2] == ["success", "▁▂▃▃▄▅▆▆▇█"]
    assert "0.00 -> 1.00" in success and "(+0.56)" in success
    assert not any("eval" in line for line in lines)  # no step evaluated
    assert [line.split()[0] for line in lines[3:]] == ["rollout", "train", "sync"]
    assert lines[3].endswith("median 6.50") and lines[5].endswith("median 0.25")
    starts = {line.index(next(c for c in line if c in BLOCKS)) for line in lines[1:]}
    assert starts == {len("  rollout s  ")}  # the sparklines start in one column, after the longest label


def test_eval_success_only_on_the_steps_that_evaluated() -> None:
    steps = [step(n, 0.0, 0.5, eval_success=n / 4 if n % 2 == 0 else None) for n in range(5)]
    line = next(line for line in learning_curve(steps) if line.lstrip().startswith("eval success"))
    assert "▁ ▅ █" in line  # fixed 0..1 scale, spaces where no eval ran
    assert "0.00 -> 1.00" in line and "first 1 mean 0.00 -> last 1 1.00" in line


def test_report_json_draws_the_same_curve() -> None:
    report = RunReport()
    for n in range(7):
        report.add(step(n, 0.1 * n, 0.2, eval_success=0.5 if n == 3 else None))
    steps = json.loads(json.dumps(report.to_dict()))["steps"]
    assert learning_curve(steps) == learning_curve(report.steps)


def test_older_reports_and_odd_values() -> None:
    old = [{"reward_mean": 0.0, "rollout_seconds": 1.0}, {"reward_mean": 1.0, "rollout_seconds": 3.0}]
    lines = learning_curve(old)
    assert [line.split()[0] for line in lines[1:]] == ["reward", "rollout"]  # no success or eval fields
    assert learning_curve([]) == []
    assert " ▄   +0.000 -> +0.000" in learning_curve([{"reward_mean": 0.0}, {"reward_mean": math.nan}])[1]  # NaN: none
    with pytest.raises(TypeError, match=r"'reward_mean' is 'high'.*a number or null"):
        learning_curve([{"reward_mean": "high"}])


def test_long_runs_are_bucketed_to_fit_a_terminal() -> None:
    lines = learning_curve([step(n, n / 200 - 1, 0.5, eval_success=0.25) for n in range(360)])
    assert lines[0] == "learning curve, 360 steps (one mark per 10.0 steps, their mean):"
    assert all(len(line) <= 120 for line in lines), max(len(line) for line in lines)
    assert "▁▁▁▂▂▂▂▂▃▃▃▃▃▄" in lines[1] and "-1.000 -> +0.795" in lines[1]
    assert lines[1].count("▁") + lines[1].count("█") < MAX_POINTS
