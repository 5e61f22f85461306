"""The rollout runner and the weight updater on the FakeEngine twin and a virtual clock: replies, refusals,
cancellation, aborts, prefix accounting, warm trajectories, and a weight swap in place."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rose_core.messages import SamplingParams, TurnAborted, TurnRequest, TurnResult, WeightApplied
from rose_core.policy import LatencyModel
from rose_executor.engine.fake_engine import FakeEngine
from rose_executor.engine.virtual_clock import VirtualClock
from rose_executor.rollout.rollout_runner import RolloutRunner
from rose_executor.rollout.weight_updater import WeightUpdater
from rose_transfer import DensePublisher

MODEL = LatencyModel(0.004, 10e-6, 0.002, 0.001)


def setup(capacity: int = 2) -> tuple[RolloutRunner, FakeEngine, VirtualClock, list[Any]]:
    clock = VirtualClock(50.0)
    sent: list[Any] = []
    engine = FakeEngine(MODEL, clock)
    return RolloutRunner(engine, "ex", capacity, sent.append, clock=clock.now), engine, clock, sent


def turn(name: str, max_tokens: int = 10, version: int = 0, prompt_tokens: int = 9) -> TurnRequest:
    return TurnRequest(
        turn_id=name, trajectory_id=f"traj-{name}", attempt=0,
        prompt_token_ids=np.arange(prompt_tokens, dtype=np.int32) % 150 + 3,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0), min_version=version, max_version=version,
    )  # fmt: skip


def replies(sent: list[Any], name: str) -> list[Any]:
    return [m for m in sent if getattr(m, "turn_id", "") == name]


async def test_a_turn_runs_and_its_result_carries_version_timing_and_warmth() -> None:
    runner, _, clock, sent = setup()
    runner.submit(turn("t1"))
    await clock.run_until(lambda: bool(sent))
    (result,) = sent
    assert isinstance(result, TurnResult)
    assert (result.executor_id, result.weight_version, result.attempt, result.finish_reason) == ("ex", 0, 0, "length")
    assert result.output_token_ids.dtype == np.int32 and result.output_logprobs.dtype == np.float32
    assert len(result.output_token_ids) == len(result.output_logprobs) == 10
    assert result.queue_seconds == 0.0  # unguarded: started at once
    assert result.run_seconds == pytest.approx(MODEL.prefill_s(9) + 9 * MODEL.decode_step_s(1))
    assert runner.warm.ids(clock.now()) == ["traj-t1"] and runner.tokens_total == 10 and runner.in_flight == 0


async def test_wrong_version_and_capacity_are_refused() -> None:
    runner, _, clock, sent = setup(capacity=2)
    runner.submit(turn("t-v5", version=5))
    assert [m.reason for m in replies(sent, "t-v5")] == ["version"]
    for name in ("c1", "c2", "c3"):
        runner.submit(turn(name, max_tokens=200))
    assert [m.reason for m in replies(sent, "c3")] == ["capacity"]
    await clock.run_until(lambda: runner.in_flight == 0)
    assert all(isinstance(replies(sent, n)[0], TurnResult) for n in ("c1", "c2"))


async def test_cancel_gets_no_reply_and_abort_all_gives_every_turn_back() -> None:
    runner, engine, clock, sent = setup()
    runner.submit(turn("x1", max_tokens=900))
    await clock.advance(0.05)
    assert runner.cancel("x1", 0) and not runner.cancel("nope", 0)
    await clock.advance(1.0)
    assert replies(sent, "x1") == [] and runner.in_flight == 0 and engine.aborted == ["x1:0"]
    runner.submit(turn("s1", max_tokens=900))
    await clock.advance(0.05)
    assert await runner.abort_all("shutdown") == 1
    assert [(type(m), m.reason) for m in replies(sent, "s1")] == [(TurnAborted, "shutdown")]


async def test_an_engine_abort_is_an_engine_error_and_prefix_hits_are_counted() -> None:
    runner, engine, clock, sent = setup()
    runner.submit(turn("e1", max_tokens=900))
    await clock.advance(0.05)
    await engine.abort("e1:0")
    await clock.advance(0.0)
    assert [m.reason for m in replies(sent, "e1")] == ["engine_error: aborted by the engine"]
    for name in ("p1", "p2"):
        runner.submit(turn(name, max_tokens=2, prompt_tokens=300))
        await clock.run_until(lambda name=name: bool(replies(sent, name)))
    first, second = replies(sent, "p1")[0], replies(sent, "p2")[0]
    assert first.prefix_hit_tokens == 0 and 0 < second.prefix_hit_tokens < 300
    assert runner.prefix_hit_rate == pytest.approx(second.prefix_hit_tokens / 600)


async def test_a_weight_swap_gives_turns_back_and_reloads_in_place(tmp_path: Path) -> None:
    runner, engine, clock, sent = setup()
    updater = WeightUpdater(runner, engine, executor_id="ex", secret=b"s" * 32, stage_dir=tmp_path, send=sent.append)
    try:
        runner.submit(turn("busy", max_tokens=900))
        await clock.advance(0.05)
        times = await updater.apply(tmp_path / "v1.bin", [], 1)
        assert runner.weight_version == 1 and not updater.updating
        assert times.aborted_turns == 1
        parts = (times.abort_s, times.pause_s, times.reload_s, times.resume_s)
        assert min(parts) >= 0 and sum(parts) <= times.seconds
        assert [m.reason for m in replies(sent, "busy")] == ["weight_update"]
        assert engine.calls == ["pause(keep=False, clear_cache=True)", "reload_weights", "resume"]
        runner.submit(turn("old", version=0))
        assert [m.reason for m in replies(sent, "old")] == ["version"]
        runner.submit(turn("new", version=1))
        await clock.run_until(lambda: bool(replies(sent, "new")))
        assert replies(sent, "new")[0].weight_version == 1
        await asyncio.sleep(0)
        assert not [m for m in sent if isinstance(m, WeightApplied)]  # apply() itself does not reply
    finally:
        await updater.close()


async def test_weight_applied_says_where_the_seconds_went(tmp_path: Path) -> None:
    """A whole update through rose-transfer onto the twin: the reply's parts are there and fit its whole."""
    runner, engine, clock, sent = setup()
    updater = WeightUpdater(runner, engine, executor_id="ex", secret=b"s" * 32, stage_dir=tmp_path, send=sent.append)
    publisher = DensePublisher(secret=b"s" * 32, host="127.0.0.1", port=0)
    try:
        runner.submit(turn("busy", max_tokens=900))
        await clock.advance(0.05)
        announce = publisher.publish(1, step=1, tensors={"w": np.arange(4096, dtype=np.float32)})
        updater.announce(announce)
        for _ in range(2000):
            if any(isinstance(m, WeightApplied) for m in sent):
                break
            await asyncio.sleep(0.01)
        applied = next(m for m in sent if isinstance(m, WeightApplied))
        assert (applied.ok, applied.version, applied.error) == (True, 1, "")
        assert applied.bytes_received >= 4096 * 4 and applied.aborted_turns == 1
        parts = (applied.abort_seconds, applied.pause_seconds, applied.reload_seconds, applied.resume_seconds)
        assert min(parts) >= 0 and sum(parts) <= applied.apply_seconds
        assert applied.queue_seconds >= 0 and applied.transfer_seconds > 0
        assert applied.transfer_seconds + applied.apply_seconds <= applied.seconds
        assert engine.calls == ["pause(keep=False, clear_cache=True)", "reload_weights", "resume"]
    finally:
        publisher.close()
        await updater.close()
