"""A fleet (`rose controller`, executors started on their own) survives its controller: SIGKILL in the middle
of a step of an asynchronous job (staleness 1: the next step's rollout runs while this one trains and ships),
`rose controller --resume` from the last checkpoint, and the executors, which kept running and serving
production traffic all along, join the new controller by themselves; the job finishes with nothing
lost and every engine on the trainer's weights. All through the resumed run a dashboard-like peer that never
reads is connected: the controller sends it the two snapshots its credit allows and then skips it every status
interval (decision 112), so nothing queues up for it however long it stays. Real processes, real vLLM CPU
engines, real sockets. At the end the job releases its executors: the dedicated one stops, the serving host
goes on serving production until its operator stops it."""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

import pytest
import zmq

from rose_core.protocol import messages as m
from rose_core.protocol.auth import Signer, write_new_secret
from rose_core.protocol.wire import Framer
from rose_core.support.metrics import free_port

from .rose_run_support import LiveRun, metric
from .standalone_fleet import served, start_executors

STEPS = 8
"""Killed after step 2; the resumed run's steps 3-8 outlast the ZMQ heartbeat that cuts off the observer that
never reads (10 s): with warmed engines three steps took less than that."""
RESUMED = list(range(3, STEPS + 1))
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[controller]
port = {port}
status_interval_s = 0.005  # a fast status stream, so the observer that never reads fills every buffer soon

[scheduler]
staleness = 1  # asynchronous steps: a resumed asynchronous job goes on with the next step and version

[rl]
checkpoint.every = 1
checkpoint.keep = 2
max_tokens_per_turn = 24
eval.every = 0
"""


def never_reading_observer(address: str, secret: bytes) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    """A peer that says Hello as an observer (so the controller streams status to it) and never reads: its
    libzmq stops taking bytes off the socket once one message waits, so it cannot answer ZMQ heartbeats
    either, and the controller closes its link after ``HEARTBEAT_TIMEOUT_MS`` (unless its queue filled first)."""
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.setsockopt(zmq.ROUTING_ID, b"stalled")
    sock.setsockopt(zmq.RECONNECT_IVL, -1)  # once the controller drops it, it stays gone (and is named in the log)
    sock.connect(address)
    sock.send_multipart(Framer(Signer(secret), m.FromController).seal(m.Hello(peer_id="stalled", kind="observer")))
    return ctx, sock


SKIPPED_WHILE_STALLED = 10
"""Status intervals (0.5 s each) the stalled observer must be skipped before the run may end."""


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rose-controller-restart")
    secret = work / "secret"
    write_new_secret(secret)
    config = CONFIG.format(work=work, port=free_port())
    args = ("--secret-file", str(secret))
    executors: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        with LiveRun(work, config, STEPS, args=args, command="controller", name="-first") as first:
            address = first.wait_for_line(r"rose-executor --controller (tcp://\S+)").group(1)
            executors = start_executors(work, address, secret)
            first.wait_for_row(2)  # step 2 trained and checkpointed; step 3 is rolling out
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait()
        text_while_down = served(executors["serving"][1])
        checkpoints = work / "run" / "checkpoints"
        with LiveRun(work, config, STEPS, args=(*args, "--resume", str(checkpoints)), command="controller",
                     name="-resumed") as resumed:
            found = resumed.wait_for_line(r"controller (tcp://\S+)  metrics (http://\S+)")
            ctx, stalled = never_reading_observer(found.group(1), secret.read_bytes().strip())
            try:  # it acknowledges nothing: after its two snapshots the controller skips it, interval after interval
                resumed.until("the stalled observer skipped", timeout_s=300, every_s=0.2, predicate=lambda: metric(
                    found.group(2), "rose_status_skipped_total") >= SKIPPED_WHILE_STALLED)
                skipped = metric(found.group(2), "rose_status_skipped_total")
                dropped = sum(metric(found.group(2), f'rose_dropped_messages_total{{reason="{reason}"}}')
                              for reason in ("peer_full", "peer_gone"))
                report = resumed.finish()
            finally:
                stalled.close(0)
                ctx.term()
        dedicated_code = executors["dedicated"][0].wait(timeout=120)  # released at the end: a job's own, it stops
        serving_proc, serving_port = executors["serving"]
        after_job = served(serving_port)  # released too: production outlives the job
        serving_after_job = serving_proc.poll() is None
        serving_proc.send_signal(signal.SIGTERM)  # only its operator stops it
        codes = {"dedicated": dedicated_code, "serving": serving_proc.wait(timeout=120)}
    finally:
        for proc, _ in executors.values():
            if proc.poll() is None:
                proc.kill()
    logs = {role: (work / f"executor-{role}.log").read_text(errors="replace") for role in executors}
    return {"report": report, "codes": codes, "logs": logs, "while_down": text_while_down, "skipped": skipped,
            "dropped": dropped, "after_job": after_job, "serving_after_job": serving_after_job,
            "checkpoints": sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step-")),
            "last_state": json.loads((checkpoints / f"step-{STEPS:06d}" / "state.json").read_text())}


def test_the_resumed_job_finishes_with_nothing_lost(restarted: dict[str, Any]) -> None:
    report = restarted["report"]
    assert report["ok"], f"{report['error']}\n{report['_stderr'][-4000:]}\n{restarted['logs']}"
    assert "resumed from" in report["_stdout"]
    assert [s["step"] for s in report["steps"]] == RESUMED  # the interrupted step 3 is run again, once
    assert report["lost_trajectories"] == 0 and report["version_mismatches"] == 0
    assert report["weight_digest_mismatches"] == 0
    assert [s["published_version"] for s in report["steps"]] == RESUMED
    assert report["steps"][0]["weight_version"] == 2  # step 3 rolled out on the checkpoint's version
    assert all(s["max_staleness"] <= 1 for s in report["steps"])
    assert all(e["weight_version"] == STEPS for e in report["executors"])


def test_asynchronous_steps_overlap_and_the_trainer_reports_its_importance_ratios(restarted: dict[str, Any]) -> None:
    """Staleness 1: the next step's rollout runs while this one trains and ships, nothing after the last step;
    the trainer's proximal / behaviour ratio stays near one (the same weights, bf16 apart)."""
    steps = restarted["report"]["steps"]
    assert steps[0]["overlap_seconds"] > 0 and steps[-1]["overlap_seconds"] == 0
    for step in steps:
        train = step["train"]
        assert 0.5 < train["behaviour_ratio_mean"] < 2.0, train
        assert 0.0 <= train["clip_fraction"] <= 1.0 and train["tokens"] > 0


def test_a_checkpoint_follows_every_step_and_only_the_newest_are_kept(restarted: dict[str, Any]) -> None:
    assert restarted["checkpoints"] == [f"step-{STEPS - 1:06d}", f"step-{STEPS:06d}"]  # checkpoint.keep = 2
    assert (restarted["last_state"]["step"], restarted["last_state"]["weight_version"]) == (STEPS, STEPS)


def test_the_executors_joined_the_new_controller_by_themselves(restarted: dict[str, Any]) -> None:
    for role, log in restarted["logs"].items():
        assert "restarted or lost this executor; joining it again" in log, log[-3000:]
        assert f"executor {role}-0 registered again with" in log, log[-3000:]
        assert log.count(f"executor {role}-0 registered with") == 1  # the first start only: no process restart
    assert restarted["codes"] == {"dedicated": 0, "serving": 0}  # released at the end; SIGTERM for the serving host


def test_the_serving_host_outlives_the_job(restarted: dict[str, Any]) -> None:
    """The job's end releases the serving host: it gives the lease back, stops the job's rollout engine and goes
    on answering production until its operator stops it (the job's end used to stop production too)."""
    assert restarted["serving_after_job"] and restarted["after_job"] == 4
    log = restarted["logs"]["serving"]
    assert "the job released it (run finished)" in log and "rollout engine stopped" in log, log[-3000:]


def test_a_peer_that_never_reads_did_not_wedge_the_resumed_run(restarted: dict[str, Any]) -> None:
    """The fixture let the run finish only once the controller had skipped the stalled observer for ten status
    intervals: nothing was queued for it meanwhile (no drop: its queue never filled), and the run ended ok."""
    assert restarted["skipped"] >= SKIPPED_WHILE_STALLED
    assert restarted["dropped"] == 0
    report = restarted["report"]
    assert report["ok"] and [s["step"] for s in report["steps"]] == RESUMED


def test_production_serving_went_on_while_the_controller_was_down(restarted: dict[str, Any]) -> None:
    assert restarted["while_down"] == 4

