"""The learning panel's model: history of finished steps -> sparkline lines that fit a width."""

from __future__ import annotations

import math

from tui_controller import make_snapshot

from rose_core.protocol.messages import StepStatus
from rose_tui.learning import LearningView, learning_view
from rose_tui.view import DashboardModel


def done(step: int, reward: float, success: float | None = None, eval_success: float | None = None,
         rollout: float = 2.0, train: float = 0.5, sync: float = 0.25) -> StepStatus:
    return StepStatus(step=step, phase="done", weight_version=step, trajectories_total=8, trajectories_done=8,
                      turns_in_flight=0, turns_queued=0, reward_mean=reward, success_rate=success,
                      eval_success=eval_success, rollout_seconds=rollout, train_seconds=train, sync_seconds=sync)


def test_the_fake_controllers_history_as_lines() -> None:
    view = DashboardModel().update(make_snapshot(t=12.0, step=4)).learning
    assert view.title == "learning (4 steps)"
    assert view.lines(40) == (
        "reward    ▁▃▆█ +0.300",
        "success   ▁▃▅▆    75%",
        "eval       ▅ ▅    50%",  # steps 0 and 2 did not evaluate
        "rollout s ▅▆▇█   3.50",
        "train s   ▂▂▂▂   0.60",
        "sync s    ▁▁▂▂   0.35",
    )


def test_a_narrow_panel_keeps_the_newest_steps() -> None:
    view = learning_view([done(s, reward=float(s), success=s / 9) for s in range(10)])
    assert view.lines(100)[0] == "reward    ▁▂▃▃▄▅▆▆▇█ +9.000"
    assert view.lines(20)[0] == "reward    ▁▅█ +9.000"  # 20 - 9 label - 6 value - 2 spaces: the last 3 steps
    assert view.lines(17)[0] == "reward     +9.000"  # no room for a mark
    assert all(len(line) <= 20 for line in view.lines(20))


def test_rates_use_a_fixed_scale_and_phases_share_one() -> None:
    view = learning_view([done(0, 0.0, success=0.5, rollout=4.0, train=2.0, sync=0.0),
                          done(1, 0.0, success=0.5, rollout=4.0, train=4.0, sync=0.0)])
    lines = dict(line.split(maxsplit=1) for line in view.lines(40)[:2])
    assert lines["success"] == "▅▅    50%"  # half way up, not the mid-block of a constant series
    rollout, train = (line for line in view.lines(40) if line.startswith(("rollout", "train")))
    assert "██" in rollout and "▅█" in train  # one scale from 0: train's 2 s is half of rollout's 4 s
    assert not any(line.startswith("sync") for line in view.lines(40))  # a phase that never took time


def test_no_history_and_older_controllers() -> None:
    assert learning_view([]) == LearningView()
    assert LearningView().lines(40) == ("no finished step yet",) and LearningView().title == "learning"
    old = learning_view([done(0, 0.1), done(1, 0.2)])  # no success or eval fields sent
    assert [line.split()[0] for line in old.lines(40)] == ["reward", "rollout", "train", "sync"]


def test_a_nan_from_the_controller_is_a_gap_not_a_crash() -> None:
    view = learning_view([done(0, 0.0), done(1, math.nan), done(2, 1.0, rollout=math.inf)])
    assert view.lines(40)[0] == "reward    ▁ █ +1.000"
