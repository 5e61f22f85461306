"""What an executor sends is checked before anything of it counts (a bug, a broken engine, a stolen key), over
real ZMQ sockets: a signed result with NaN logprobs, one with mismatched lengths, and a registration asking for
absurd capacity are refused and counted, and the run goes on on what the healthy executor sends; a turn that
fails on every executor is given up and its trajectory dropped, the step trains on the rest; a keyless flood of
huge unsigned notices is dropped as it arrives."""

from __future__ import annotations

import itertools
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from control_frames import rejected
from rl_job_peers import SECRET, CharCodec, Executor, Publisher, Trainer

from rose_core.app.config import ControllerConfig, RLConfig, RunConfig
from rose_core.app.controller.controller import Controller
from rose_core.app.controller.controller_metrics import REFUSED_RESULTS, TURNS_GIVEN_UP
from rose_core.app.jobs.rl_job import RLJob
from rose_core.protocol import messages as m
from rose_core.support.metrics import REJECTED_MESSAGES
from rose_core.transport.channel import ControlClient


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[RLJob, Controller, Trainer, list[Executor]]]:
    """A job over a real ZMQ controller with two executors, d0 and b0 (the tests spoil what b0 sends)."""
    rl = msgspec.convert({"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_turns": 2, "algorithm": "grpo",
                          "eval": {"every": 0}, "max_tokens_per_turn": 8}, RLConfig)
    config = RunConfig(rl=rl, controller=ControllerConfig(stall_timeout_s=60.0), run_dir=str(tmp_path))
    ctl = Controller(config, SECRET)
    up = lambda _msg: "up"  # noqa: E731
    executors = [Executor(ctl, up).join("d0", ControlClient), Executor(ctl, up).join("b0", ControlClient)]
    trainer = Trainer(executors[0])
    yield RLJob(ctl, config, CharCodec(), trainer, Publisher()), ctl, trainer, executors
    for executor in executors:
        executor.client.close()
    ctl.close()


def nan_then_short(result: m.TurnResult, spoiled: list[int]) -> m.TurnResult:
    """Every other result with a NaN logprob, the others with one logprob fewer than tokens."""
    spoiled.append(1)
    logprobs = result.output_logprobs.copy()
    if len(spoiled) % 2:
        logprobs[0] = np.nan
        return msgspec.structs.replace(result, output_logprobs=logprobs)
    return msgspec.structs.replace(result, output_logprobs=logprobs[:-1])


def test_bad_results_and_an_absurd_registration_are_refused_and_counted_and_the_run_goes_on(job: Any) -> None:
    rl_job, ctl, trainer, (_good, bad) = job
    spoiled: list[int] = []
    bad.spoil = lambda result: nan_then_short(result, spoiled)
    refused_before = {r: REFUSED_RESULTS.labels(r)._value.get() for r in ("logprobs", "shape")}
    registrations_before = REJECTED_MESSAGES.labels("bad_registration")._value.get()

    told: list[object] = []
    greedy = ControlClient(ctl.address, SECRET, "greedy", on_message=lambda _peer, msg: told.append(msg))
    try:
        greedy.send(m.Hello(peer_id="greedy", kind="executor"))
        ctl.pump(0.2)
        greedy.send(m.Register(executor_id="greedy", role="dedicated", device="cpu", host="h", models=[],
                               memory_bytes=1, rollout_capacity=10**9, weight_version=0))
        for _ in range(10):
            ctl.pump(0.05)
        refusals = [msg for msg in told if isinstance(msg, m.ErrorReport)]
        assert [r.code for r in refusals] == ["bad_registration"] and "rollout_capacity" in refusals[0].message
        assert "greedy" not in ctl.executors
        assert REJECTED_MESSAGES.labels("bad_registration")._value.get() == registrations_before + 1

        reports = [rl_job.run_step(step) for step in (1, 2)]
    finally:
        greedy.close()
    assert len(spoiled) >= 4  # b0 ran turns in both steps; every one of its results was spoiled
    assert all(r.lost_trajectories == 0 and r.failed_trajectories == 0 and r.trajectories == 4 for r in reports)
    assert sum(r.refused_results for r in reports) == len(spoiled)
    assert ctl.stats.refused_results == {"logprobs": (len(spoiled) + 1) // 2, "shape": len(spoiled) // 2}
    assert {r: REFUSED_RESULTS.labels(r)._value.get() - refused_before[r] for r in refused_before} == \
        ctl.stats.refused_results
    trained = [s for call in trainer.calls for s in call["samples"]]
    assert len(trainer.calls) == 2 and trained
    assert all(math.isfinite(x) and x == -0.5 for s in trained for x in s.behaviour_logprobs)


def test_a_turn_that_fails_on_every_executor_is_given_up_and_the_step_trains_on_the_rest(job: Any) -> None:
    rl_job, ctl, trainer, executors = job
    doomed = "s1-p0-g0"

    def nan_for_the_doomed(result: m.TurnResult) -> m.TurnResult:
        if result.trajectory_id != doomed:
            return result
        return msgspec.structs.replace(result, output_logprobs=np.full_like(result.output_logprobs, np.nan))

    for executor in executors:
        executor.spoil = nan_for_the_doomed
    given_up_before = TURNS_GIVEN_UP._value.get()
    report = rl_job.run_step(1)
    assert (report.failed_trajectories, report.lost_trajectories, report.trajectories) == (1, 0, 3)
    assert report.refused_results == 2  # once on each executor: then there is none it has not failed on
    assert TURNS_GIVEN_UP._value.get() == given_up_before + 1 and ctl.stats.turns_given_up == 1
    assert {s.trajectory_id for s in trainer.calls[0]["samples"]} == {"s1-p0-g1", "s1-p1-g0", "s1-p1-g1"}


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_keyless_flood_of_huge_unsigned_notices_is_dropped_and_costs_the_controller_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """200 unsigned notices of 32 MiB from a peer without a key while the controller's loop trains (does not
    read) and then runs: each is refused as it arrives (before it is decoded or queued), the controller's
    memory and log stay flat, and the healthy executor heartbeating beside the flood is never timed out."""
    config = RunConfig(controller=ControllerConfig(stall_timeout_s=2.0), run_dir=str(tmp_path))
    ctl = Controller(config, SECRET)
    healthy = Executor(ctl, lambda _msg: "up").join("d0", ControlClient)
    done = threading.Event()

    def heartbeats() -> None:
        for seq in itertools.count():
            if done.wait(0.25):
                return
            healthy.client.send(m.Heartbeat(executor_id="d0", seq=seq, sent_at=time.time(), load=m.LoadReport()))

    flood = (  # a peer of its own (its buffers are not the controller's)
        "import sys, zmq\n"
        "from rose_core.protocol.wire import UNSIGNED_NOTICE, envelope\n"
        "ctx = zmq.Context()\n"
        "sock = ctx.socket(zmq.DEALER)\n"
        "sock.connect(sys.argv[1])\n"
        "notice = [envelope(UNSIGNED_NOTICE), bytes(32), b'\\xa5' * (32 << 20)]\n"
        "for _ in range(200):\n"
        "    sock.send_multipart(notice, copy=False)\n"
        "sock.close(linger=-1)\n"
        "ctx.term()\n"  # every notice leaves before the process ends
    )

    before, rss_before = rejected("oversized_notice"), rss_bytes()
    caplog.set_level(logging.INFO)
    beating = threading.Thread(target=heartbeats)
    beating.start()
    flooding = subprocess.Popen([sys.executable, "-c", flood, ctl.address])
    stalled = []
    try:
        time.sleep(2.5)  # a train step: the loop reads nothing, the I/O thread takes what arrives
        deadline = time.monotonic() + 120
        while (flooding.poll() is None or rejected("oversized_notice") < before + 200) and time.monotonic() < deadline:
            ctl.pump(0.05)
            stalled += [eid for eid, rec in ctl.executors.items() if rec.state == "stalled"]
        for _ in range(10):
            ctl.pump(0.05)
    finally:
        done.set()
        beating.join()
        flooding.kill()
        flooding.wait()
        healthy.client.close()
        ctl.close()
    assert rejected("oversized_notice") == before + 200
    assert stalled == [] and "d0" in ctl.executors and ctl.scheduler.counters["rerouted_stalled"] == 0
    assert rss_bytes() - rss_before < 256 << 20  # one notice is 32 MiB; 200 held would be 6.4 GiB
    logged = sum(len(r.getMessage()) for r in caplog.records)
    assert logged < 20_000, f"{len(caplog.records)} log records, {logged} characters"
