"""`rose run` with a serving burst on the borrowed executor while its rollout turns wait for the guard: the
controller moves the turns held there to the dedicated executor once it has room (`scheduler.move_held_after_s`,
on by default) and cancels them on the serving executor, whose engine never started them. Nothing is lost or
counted twice. Real vLLM CPU engines, real sockets, real traffic.

The guard's budgets are 3x the serving-alone profile (the demo's are 10x), so that it admits a few of the turns
routed to it and holds the rest; a burst of ten long production requests (repeated once per step at most,
until the controller logs a move) leaves it no slack at all for seconds. Whether it holds a turn at the moment
the dedicated executor has room is still timing: the loop gives it up to nine steps."""

from __future__ import annotations

import re

import pytest

from .rose_run_support import LiveRun, metric
from .test_rose_run_faults import burst, served_model

STEPS = 12
MOVED = r"held back on serving-0 for over [\d.]+ s while a dedicated executor has room: moved there"
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[rl]
prompts_per_step = 2
max_tokens_per_turn = 96
eval_every = 0

[scheduler]
borrow_after_s = 0.5

[executors.serving_overrides]
slo_from_profile = 3
"""


@pytest.fixture(scope="module")
def run_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("rose-run-held")
    with LiveRun(work, CONFIG.format(work=work), STEPS) as run:
        run.wait_for_row(1)
        serving = run.logged("serving-0", r"metrics on (\S+)")
        endpoint = run.logged("serving-0", r"OpenAI-compatible API on (\S+)")
        model = served_model(endpoint)
        while run.rows_so_far() < STEPS - 3 and not run.log_has(MOVED):
            run.until("rollout turns on serving-0", lambda: metric(serving, "rose_executor_rollout_tokens_admitted") > 0
                      or metric(serving, "rose_executor_rollout_tokens_held") > 0, timeout_s=300, every_s=0.005)
            statuses = burst(endpoint, model, requests=10, max_tokens=200)
            assert statuses == [200] * len(statuses) or run.proc.poll() is not None, statuses
            run.wait_for_row(run.rows_so_far() + 1)
        return run.finish()


def test_the_run_finishes_ok_with_nothing_lost(run_report: dict) -> None:
    assert run_report["ok"], f"{run_report['error']}\n{run_report['_stderr'][-3000:]}\n{run_report['_logs']}"
    assert run_report["lost_trajectories"] == 0 and run_report["version_mismatches"] == 0
    assert run_report["serving_failed_requests"] == 0 and run_report["turns_overdue"] == 0


def test_held_turns_moved_to_the_dedicated_executor_and_were_cancelled_on_the_serving_one(run_report: dict) -> None:
    moved = re.findall(r"turn (\S+) held back on serving-0", run_report["_stderr"])
    assert moved, run_report["_stderr"][-3000:]
    assert run_report["turns_held_moved"] == len(moved) == sum(s["turns_held_moved"] for s in run_report["steps"])
    serving = next(e for e in run_report["executors"] if e["executor_id"] == "serving-0")
    assert serving["cancelled_turns"] >= len(moved) and serving["cancelled_still_running"] == 0, serving
    log = run_report["_log_files"]["executor-serving-0"]
    stopped = set(re.findall(r"cancelled turn (\S+):\d+ (?:before it started|\(re-routed)", log))
    assert set(moved) <= stopped, (moved, stopped)  # each cancel reached the serving executor and stopped it
    assert f"held moved {len(moved)})" in run_report["_stdout"]  # the summary line says it
