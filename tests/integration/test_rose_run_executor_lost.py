"""`rose run` loses an executor in the middle of a step (SIGKILL: no Goodbye, no reply for its turns) and goes
on on the rest: the dead one is taken out of the job, its turns re-routed, and every step still trains on every
trajectory. Real engines, real processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rose_core.app.config import RLConfig

from .rose_run_support import LiveRun

STEPS = 3
GROUP_SIZE = RLConfig().group_size
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[rl]
max_tokens_per_turn = 24
eval.every = 0
"""


def executor_pid(run_dir: Path, executor_id: str) -> int:
    """The pid of this run's executor ``executor_id`` (its command line names the run's config file)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = (Path("/proc") / pid / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"rose_executor" in argv and executor_id.encode() in argv and any(str(run_dir).encode() in a for a in argv):
            return int(pid)
    raise AssertionError(f"no process for executor {executor_id} of {run_dir}")


@pytest.fixture(scope="module")
def lost(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rose-run-executor-lost")
    with LiveRun(work, CONFIG.format(work=work), STEPS) as run:
        run.wait_for_row(1)
        os.kill(executor_pid(work / "run", "serving-0"), signal.SIGKILL)
        return run.finish()


def test_the_job_finishes_on_the_executor_left(lost: dict[str, Any]) -> None:
    assert lost["ok"], f"{lost['error']}\n{lost['_stderr'][-3000:]}\n{lost['_logs']}"
    assert [s["step"] for s in lost["steps"]] == [1, 2, 3]
    assert lost["lost_trajectories"] == 0 and lost["version_mismatches"] == 0
    assert lost["weight_digest_mismatches"] == 0
    # every group rolled out (dynamic sampling's refills included) came back whole, each trajectory once
    assert all(s["trajectories"] == s["groups"] * GROUP_SIZE for s in lost["steps"])


def test_the_dead_executor_was_taken_out_and_named(lost: dict[str, Any]) -> None:
    assert list(lost["retired_executors"]) == ["serving-0"]
    assert "process exited with code -9" in lost["retired_executors"]["serving-0"]
    assert "executor serving-0 is gone" in lost["_stdout"] and "the job goes on without it" in lost["_stdout"]
    assert [e["executor_id"] for e in lost["executors"]] == ["dedicated-0"]
    assert all(s["turns_serving"] == 0 for s in lost["steps"][2:])  # step 3: nothing left on the serving pool
