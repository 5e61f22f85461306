"""`rose run` (the demo's defaults: one dedicated and one borrowed serving executor, bursty production traffic)
with extra production bursts on the serving executor: turns its guard holds back move to the dedicated executor
once it has room (`scheduler.move_held_after_s`, on by default) and are cancelled on the serving executor, whose
engine never started them. Nothing is lost or counted twice. Real vLLM CPU engines, real sockets, real traffic.

Whether the guard holds a turn while the dedicated executor has room is timing: in three 30-step runs of the
demo (`benchmarks/held_turns.py`, docs/benchmarks.md) 8-12 turns moved per run. Here each step also gets a
short burst once turns run on the serving executor, until the first move is logged; the run has 16 steps."""

from __future__ import annotations

import re
import time

import pytest

from .rose_run_support import LiveRun, metric
from .test_rose_run_faults import burst, served_model

STEPS = 16
MOVED = r"held back on serving-0 for over [\d.]+ s while a dedicated executor has room: moved there"
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[rl]
eval_every = 0
"""


def _turns_on(serving: str) -> bool:
    try:
        return (metric(serving, "rose_executor_rollout_tokens_admitted") > 0
                or metric(serving, "rose_executor_rollout_tokens_held") > 0)
    except OSError:  # the run (and this endpoint) ended, or a poll met a reset connection
        return False


@pytest.fixture(scope="module")
def run_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("rose-run-held")
    with LiveRun(work, CONFIG.format(work=work), STEPS) as run:
        run.wait_for_row(1)
        serving = run.logged("serving-0", r"metrics on (\S+)")
        endpoint = run.logged("serving-0", r"OpenAI-compatible API on (\S+)")
        model = served_model(endpoint)
        bursted = 0
        while run.rows_so_far() < STEPS - 2 and not run.log_has(MOVED) and run.proc.poll() is None:
            if bursted == run.rows_so_far() or not _turns_on(serving):  # one burst per step, while turns run there
                time.sleep(0.005)
                continue
            bursted = run.rows_so_far()
            statuses = burst(endpoint, model, requests=6, max_tokens=120)
            assert statuses == [200] * len(statuses) or run.proc.poll() is not None, statuses
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
