"""`rose run` with asynchronous steps (``scheduler.staleness = 1``: the next step's rollout runs while this
one trains and ships) and a checkpoint after every step; then a second `rose run --resume` from the last
checkpoint goes on with the next step and the next weight version. Real vLLM CPU engines, real trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .rose_run_support import run_report as rose_run

CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[scheduler]
staleness = 1

[rl]
checkpoint.every = 1
checkpoint.keep = 2
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    work = tmp_path_factory.mktemp("rose-run-async")
    config = CONFIG.format(work=work)
    first = rose_run(work, config, 2)
    assert first["ok"], f"{first['error']}\n{first['_stderr'][-3000:]}\n{first['_logs']}"
    resumed = rose_run(work, config, 3, "--resume", str(work / "run" / "checkpoints"))
    return first, resumed


def test_asynchronous_steps_keep_every_turn_inside_its_window(runs: tuple[dict, dict]) -> None:
    first, _ = runs
    assert first["version_mismatches"] == 0 and first["lost_trajectories"] == 0
    assert [s["published_version"] for s in first["steps"]] == [1, 2]
    assert all(s["max_staleness"] <= 1 for s in first["steps"])
    assert first["steps"][0]["overlap_seconds"] > 0  # step 2's rollout ran while step 1 trained and shipped
    assert first["steps"][-1]["overlap_seconds"] == 0  # nothing after the last step


def test_the_trainer_reports_its_importance_ratios(runs: tuple[dict, dict]) -> None:
    for step in runs[0]["steps"]:
        train = step["train"]
        assert 0.5 < train["behaviour_ratio_mean"] < 2.0, train  # proximal / behaviour: the same weights, bf16 apart
        assert 0.0 <= train["clip_fraction"] <= 1.0 and train["tokens"] > 0


def test_a_checkpoint_follows_every_step_and_only_the_newest_are_kept(runs: tuple[dict, dict]) -> None:
    first, resumed = runs
    written = [Path(s["checkpoint"]) for s in first["steps"] + resumed["steps"]]
    assert [p.name for p in written] == ["step-000001", "step-000002", "step-000003"]
    kept = sorted(p.name for p in written[0].parent.iterdir() if p.name.startswith("step-"))
    assert kept == ["step-000002", "step-000003"]  # checkpoint_keep = 2
    state = json.loads((written[-1] / "state.json").read_text())
    assert state["step"] == 3 and state["weight_version"] == 3


def test_resume_goes_on_with_the_next_step_and_version(runs: tuple[dict, dict]) -> None:
    _, resumed = runs
    assert resumed["ok"], f"{resumed['error']}\n{resumed['_stderr'][-3000:]}\n{resumed['_logs']}"
    assert "resumed from" in resumed["_stdout"]
    (step,) = resumed["steps"]
    assert step["step"] == 3 and step["weight_version"] == 2 and step["published_version"] == 3
    assert resumed["version_mismatches"] == 0
    assert all(e["weight_version"] == 3 for e in resumed["executors"])
