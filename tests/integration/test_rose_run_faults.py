"""`rose run` with serving-first memory on (the default) and two induced faults, each in its own step: from
step 2 on, serving bursts (repeated until one crosses the high watermark while rollout turns run beside it:
one emergency cut, the youngest turns aborted and re-routed, the budget frozen until the next step); in a later
step, the dedicated executor freezes (SIGSTOP, engine included) past the stall timeout, its turns are
re-routed, and when it thaws the controller's CancelTurn stops them there (its engine holds no request for
them). Nothing is lost. Real vLLM CPU engines, real sockets, real traffic, real signals."""

from __future__ import annotations

import http.client
import json
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from rose_core.app.rl.demo.models import ensure_models
from rose_executor.profile.model_info import count_parameters
from rose_executor.revoke_cli import find_executor

from .rose_run_support import LiveRun, metric

STEPS = 14
"""Room for the bursts (they repeat until one crosses the watermark with turns to abort, over a step or more:
steps are short, and a cut that found nothing to abort freezes the budget until the next step) and a later
step for the freeze; the run is stopped (SIGUSR1, a clean stop) one step after the freeze."""
ABORTED = re.compile(r"aborting [1-9]\d* rollout turns")
ROLLOUT_TURN_BYTES = 300 * 512  # a turn's KV reservation at ~300 tokens (prompt + max_tokens), policy 512 B/token
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[rl]
max_tokens_per_turn = 192
algorithm = "grpo"
trainer.lr = 1e-3
eval.every = 0

[load]
base_rps = 1.0
burst_rps = 1.5

[slo]
ttft_ms = 5000
tpot_ms = 1000
from_alone = 0  # the serving executor's budgets come from its profile below

[controller]
turn_timeout_s = 60

[executors.serving_overrides]
memory = {{ device_bytes = {device} }}
slo = {{ from_profile = 50 }}
"""


# `turn_timeout_s = 60`: a turn held longer than that on an executor that still heartbeats is re-routed (the
# product's bound on a hold; its default is 600 s), so a turn lost on an executor costs this run a minute, not
# the test's timeout, and the run says so: `turns_overdue` must stay 0. (It did not: a turn given back by a
# memory cut in the same loop iteration that submitted or released it had its task cancelled before the task
# first ran, which skips the coroutine's own except and finally, so the executor never replied and kept it
# in flight; two such turns in one local run, and a clean-clone CI run past the test timeout. Fixed in the
# rollout runner, with a unit test.)
# The RL settings from before the demo's faster-learning defaults (grpo, lr 1e-3, no evaluation): the policy
# stays near random, so its turns keep generating their 192 tokens and hold KV when the burst arrives (with 64 a run saw 12 crossings, none with a turn still in flight; with 192, three of three aborted turns) (at the
# demo's lr 3e-3 it soon answers in a few tokens, and a burst can find no turn to abort). This test is about
# faults, not learning (test_rose_run.py asserts the learning).
# A looser serving SLO than the demo's (guard budgets 50x the serving-alone profile, not 10x; the report's
# [slo] above them): on a 2-core host every engine of the run (two executors, the trainer) shares the cores, and
# serving latency raised by that contention keeps the demo's guard without headroom for whole steps (a late
# request's slack stays negative while it decodes), so serving-0 could see no rollout turn in the step the burst
# needs one. This test is about the memory policy and stalls; the SLO runs (test_rose_run*.py) keep the demo's.


def small_device(models: Path) -> int:
    """A host share whose rollout budget holds about four turns: 0.8 x share - both weights (20% headroom),
    so a burst of a few long serving requests crosses the high watermark (half the headroom)."""
    paths = ensure_models(models)
    weights = 2 * (count_parameters(paths.policy) + count_parameters(paths.serving))  # bfloat16
    return int((weights + 4 * ROLLOUT_TURN_BYTES) / 0.8)


def served_model(endpoint: str) -> str:
    url = urlsplit(endpoint)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=120)
    try:
        conn.request("GET", f"{url.path}/models")
        return str(json.loads(conn.getresponse().read())["data"][0]["id"])
    finally:
        conn.close()


def burst(endpoint: str, model: str, requests: int = 6, max_tokens: int = 200) -> list[int]:
    """Long production requests at once (each reserves (48 + max_tokens) x 2 KiB of serving KV); the model
    is looked up beforehand, so the requests arrive while the rollout turns seen running still run."""
    url = urlsplit(endpoint)

    def one(_: int) -> int:
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=120)
        try:
            body = {"model": model, "prompt": list(range(4, 52)), "max_tokens": max_tokens, "ignore_eos": True}
            conn.request("POST", f"{url.path}/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except OSError:  # the run (and this endpoint) ended while the burst ran: the caller checks which
            return 0
        finally:
            conn.close()

    with ThreadPoolExecutor(requests) as pool:
        return list(pool.map(one, range(requests)))


def freeze(executor_id: str, seconds: float) -> None:
    """SIGSTOP the executor and its engine processes for ``seconds``, then SIGCONT them."""
    (pid,) = find_executor(executor_id)
    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    for proc in tree:
        proc.send_signal(signal.SIGSTOP)
    time.sleep(seconds)
    for proc in tree:
        proc.send_signal(signal.SIGCONT)


@pytest.fixture(scope="module")
def run_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("rose-run-faults")
    config = CONFIG.format(work=work, device=small_device(work / "models"))
    with LiveRun(work, config, STEPS) as run:
        run.wait_for_row(1)
        serving = run.logged("serving-0", r"metrics on (\S+)")
        endpoint = run.logged("serving-0", r"OpenAI-compatible API on (\S+)")
        model = served_model(endpoint)
        while run.rows_so_far() < STEPS - 2:  # a burst while turns run beside it, until one crossing aborts turns
            # (a cut that found none, the turns having just finished, freezes the budget until the next step: wait
            # for it to thaw, so that every burst can cut); the last steps are the freeze's
            run.until("rollout turns running on serving-0 under a budget that is not frozen",
                      lambda: metric(serving, "rose_executor_rollout_budget_frozen") == 0
                      and metric(serving, "rose_executor_rollout_tokens_admitted") > 0, every_s=0.005)
            statuses = burst(endpoint, model, requests=10, max_tokens=300)
            assert statuses == [200] * len(statuses) or run.proc.poll() is not None, statuses  # served while it runs
            if ABORTED.search(run.executor_log("serving-0")):
                break
        run.wait_for_row(run.rows_so_far() + 1)  # the freeze goes into a step of its own, from its start
        dedicated = run.logged("dedicated-0", r"metrics on (\S+)")
        run.until("a turn running on dedicated-0",
                  lambda: metric(dedicated, "rose_executor_rollout_tokens_admitted") > 0, every_s=0.005)
        freeze("dedicated-0", 3.5)  # the stall timeout is 2 s
        run.wait_for_row(run.rows_so_far() + 1)  # the freeze's step ends: its cancellations reached dedicated-0
        run.proc.send_signal(signal.SIGUSR1)  # nothing left to induce: stop cleanly after the step in flight
        return run.finish()


def test_the_run_finishes_ok_with_nothing_lost(run_report: dict) -> None:
    assert run_report["ok"], f"{run_report['error']}\n{run_report['_stderr'][-3000:]}\n{run_report['_logs']}"
    stopped = run_report["stopped_after_step"]  # SIGUSR1 once the faults were done: a clean stop, not an interrupt
    assert 0 < stopped < STEPS and len(run_report["steps"]) == stopped and run_report["_rc"] == 0, stopped
    assert f"stopping after step {stopped} of {STEPS}, as asked (SIGUSR1)" in run_report["_stdout"]
    assert run_report["lost_trajectories"] == 0 and run_report["version_mismatches"] == 0
    assert run_report["serving_failed_requests"] == 0
    assert run_report["turns_overdue"] == 0, [s["turns_overdue"] for s in run_report["steps"]]  # no turn lost in flight


def test_the_serving_burst_cut_the_budget_aborted_turns_and_froze_it_until_the_step(run_report: dict) -> None:
    serving = next(e for e in run_report["executors"] if e["executor_id"] == "serving-0")
    assert serving["memory_budget_bytes"] > 0 and serving["emergency_cuts"] >= 1
    log = run_report["_log_files"]["executor-serving-0"]
    assert "serving memory crossed the high watermark" in log
    aborted = [int(n) for n in re.findall(r"aborting (\d+) rollout turns", log)]
    assert aborted and max(aborted) >= 1, aborted  # turns that no longer fit were given back...
    assert run_report["turns_rerouted"] >= max(aborted)  # ...and re-routed
    assert serving["emergency_cuts"] <= STEPS  # at most one cut per step: frozen until the next one


def test_turns_rerouted_off_a_frozen_executor_are_cancelled_there(run_report: dict) -> None:
    dedicated = next(e for e in run_report["executors"] if e["executor_id"] == "dedicated-0")
    assert dedicated["cancelled_turns"] >= 1, dedicated
    assert dedicated["cancelled_still_running"] == 0  # its engine holds no request for a cancelled turn
    assert "the engine holds no request for it" in run_report["_log_files"]["executor-dedicated-0"]
