"""`rose run` with asynchronous steps (``scheduler.staleness = 1``: the next step's rollout runs while this
one trains and ships). Resuming an asynchronous job from its checkpoint, and keeping only the newest
checkpoints: `test_rose_controller_restart.py`. Real vLLM CPU engines, real trainer."""

from __future__ import annotations

import pytest

from .rose_run_support import run_report as rose_run

CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[scheduler]
staleness = 1
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("rose-run-async")
    report = rose_run(work, CONFIG.format(work=work), 2)
    assert report["ok"], f"{report['error']}\n{report['_stderr'][-3000:]}\n{report['_logs']}"
    return report


def test_asynchronous_steps_keep_every_turn_inside_its_window(run: dict) -> None:
    assert run["version_mismatches"] == 0 and run["lost_trajectories"] == 0
    assert [s["published_version"] for s in run["steps"]] == [1, 2]
    assert all(s["max_staleness"] <= 1 for s in run["steps"])
    assert run["steps"][0]["overlap_seconds"] > 0  # step 2's rollout ran while step 1 trained and shipped
    assert run["steps"][-1]["overlap_seconds"] == 0  # nothing after the last step


def test_the_trainer_reports_its_importance_ratios(run: dict) -> None:
    for step in run["steps"]:
        train = step["train"]
        assert 0.5 < train["behaviour_ratio_mean"] < 2.0, train  # proximal / behaviour: the same weights, bf16 apart
        assert 0.0 <= train["clip_fraction"] <= 1.0 and train["tokens"] > 0
