"""`rose run`'s serving executors measure their SLO on production served alone (``[slo] from_alone``); the
guard's floor check names its fix."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from rose_core.app.config import RunConfig
from rose_core.app.run.executor_files import executor_config
from rose_core.config.executor_config import GuardSlo, parse_executor_config
from rose_core.config.sections import dump_toml
from rose_core.policy import SloBudgets
from rose_executor.co_serving.co_serving import slo_budgets
from rose_executor.profile.latency_profile import EngineProfile

PROFILE = EngineProfile(
    key="p", prefill_points=[(16, 0.004), (128, 0.006), (512, 0.020)], decode_points=[(1, 0.002), (8, 0.003)]
)


def test_serving_executors_of_rose_run_measure_their_slo_on_production(policy_dir: Path, serving_dir: Path) -> None:
    run = RunConfig()
    serving = parse_executor_config(dump_toml(executor_config(run, "serving", policy_dir, serving_dir)))
    assert serving.slo.from_alone == run.slo.from_alone == 2.0  # at most 2 x serving alone
    assert serving.slo.calibration_requests == run.slo.calibration_requests
    assert slo_budgets(serving, PROFILE) is None  # measured by the host, not derived here
    quiet = msgspec.convert({"load": {"enabled": False}}, RunConfig)  # no production to measure on
    fixed = parse_executor_config(dump_toml(executor_config(quiet, "serving", policy_dir, serving_dir)))
    assert fixed.slo.from_alone == 0 and slo_budgets(fixed, PROFILE) == SloBudgets(2.0, 0.4)
    assert GuardSlo().from_alone == 0  # an operator's executor keeps its own budgets unless told to measure
    with pytest.raises(ValueError, match="both set"):
        GuardSlo(from_alone=1.5, from_profile=2.0)


def test_a_ttft_budget_below_the_guards_floor_is_reported_with_its_fix(
    caplog: pytest.LogCaptureFixture, policy_dir: Path, serving_dir: Path
) -> None:
    """The executor publishes the tightest TTFT budget co-location can keep (the longest profiled prompt's
    prefill + the rollout step a hold cannot stop + the margin) and warns, naming the settings to change, when
    its budget is below it; a budget above it passes quietly."""
    from rose_core.policy import CoServingGuard
    from rose_executor import metrics
    from rose_executor.co_serving.co_serving import check_ttft_floor, guard_settings

    serving = parse_executor_config(dump_toml(executor_config(RunConfig(), "serving", policy_dir, serving_dir)))
    rollout = EngineProfile(key="r", prefill_points=[(16, 0.003), (512, 0.015)], decode_points=[(1, 0.002), (16, 0.006)])
    slo = SloBudgets(0.05, 0.01)
    guard = CoServingGuard.build(guard_settings(serving, slo), PROFILE.latency_model(), rollout.latency_model())
    expected = guard.ttft_floor_s(512)
    assert expected > PROFILE.latency_model().prefill_s(512, serving.rollout.prefill_chunk_tokens)
    with caplog.at_level("WARNING", logger="rose_executor.co_serving.co_serving"):
        assert check_ttft_floor(guard, type(slo)(expected * 0.8, slo.tpot_s), 512) == pytest.approx(expected)
    assert metrics.GUARD_TTFT_FLOOR._value.get() == pytest.approx(expected)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "below what co-location can keep" in warning and "Raise [slo] ttft_ms" in warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="rose_executor.co_serving.co_serving"):
        check_ttft_floor(guard, type(slo)(expected * 1.2, slo.tpot_s), 512)
    assert not caplog.records
