"""The rollout runner and the weight updater on the FakeEngine twin and a virtual clock: replies, refusals,
cancellation, aborts, prefix accounting, warm trajectories, and a weight swap in place."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from rose_core.policy import LatencyModel
from rose_core.protocol.messages import SamplingParams, TurnAborted, TurnRequest, TurnResult, WeightApplied
from rose_executor.engine.engine_protocol import WeightCommit
from rose_executor.rollout.rollout_runner import RolloutRunner
from rose_executor.testing.fake_engine import FakeEngine
from rose_executor.testing.virtual_clock import VirtualClock
from rose_executor.weights.weight_updater import WeightUpdater
from rose_transfer import SparsePublisher

MODEL = LatencyModel(0.004, 10e-6, 0.002, 0.001)


def setup(capacity: int = 2, engine_type: type[FakeEngine] = FakeEngine) -> tuple[
        RolloutRunner, FakeEngine, VirtualClock, list[Any]]:
    clock = VirtualClock(50.0)
    sent: list[Any] = []
    engine = engine_type(MODEL, clock)
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
    assert (runner.cancelled_total, runner.cancelled_still_running) == (1, 0)  # the engine holds no request
    runner.submit(turn("s1", max_tokens=900))
    await clock.advance(0.05)
    assert await runner.abort_all("shutdown") == 1
    assert [(type(m), m.reason) for m in replies(sent, "s1")] == [(TurnAborted, "shutdown")]
    assert runner.aborted_total == 1


async def test_a_turn_given_back_before_its_task_first_ran_still_gets_its_reply() -> None:
    """A cut, a revoke or a cancel in the same loop iteration as the submit cancels a task that never started
    (Python then skips the coroutine's own except and finally): the turn still ends, with its one reply."""
    runner, _, clock, sent = setup(capacity=3)
    runner.submit(turn("g1"))
    assert runner.abort_keys(["g1:0"], "memory") == 1  # no await in between: the task has not run yet
    await clock.advance(0.01)
    runner.submit(turn("g2"))
    runner.submit(turn("g3"))
    await asyncio.gather(*runner.abort_now("revoked"), return_exceptions=True)
    assert [(type(m), m.turn_id, m.reason) for m in sent] == [
        (TurnAborted, "g1", "memory"), (TurnAborted, "g2", "revoked"), (TurnAborted, "g3", "revoked")]
    assert runner.in_flight == 0 and runner.aborted_total == 3
    runner.submit(turn("c1"))
    assert runner.cancel("c1", 0)  # the controller's cancel: no reply, counted, nothing left in flight
    await clock.advance(0.01)
    assert replies(sent, "c1") == [] and runner.in_flight == 0 and runner.cancelled_total == 1


async def test_a_cancelled_turn_still_waiting_for_the_guard_ends_counted_and_never_reaches_the_engine() -> None:
    """What the controller does to a held turn it moves to a dedicated executor (decision 823)."""
    clock, sent = VirtualClock(50.0), []
    engine = FakeEngine(MODEL, clock)
    runner = RolloutRunner(engine, "ex", 2, sent.append, clock=clock.now, guarded=True)
    runner.submit(turn("h1"))
    await clock.advance(0.5)  # no guard here releases it: it waits, as behind a serving burst
    assert runner.in_flight == 1 and engine.live_requests() == []
    assert runner.cancel("h1", 0)
    await clock.advance(0.01)
    assert replies(sent, "h1") == [] and runner.in_flight == 0
    assert (runner.cancelled_total, runner.cancelled_still_running) == (1, 0) and engine.aborted == []


async def test_a_revoked_runner_gives_every_turn_back_and_refuses_new_ones_for_good() -> None:
    runner, _engine, clock, sent = setup()
    runner.submit(turn("r1", max_tokens=900))
    await clock.advance(0.05)
    assert await runner.revoke() == 1
    runner.refuse("weight_update")
    runner.admit()  # a weight update's admit does not lift a revocation
    runner.submit(turn("r2"))
    assert [m.reason for m in replies(sent, "r1") + replies(sent, "r2")] == ["revoked", "revoked"]


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


SECRET = b"s" * 32


def tensors(version: int) -> dict[str, np.ndarray]:
    """A two-tensor model whose version ``v`` differs from ``v - 1`` in a handful of words of ``w``."""
    w = np.arange(4096, dtype=np.float32)
    w[: 5 * version] += 1.0
    return {"w": w, "b": np.ones(64, dtype=np.float32)}


@contextlib.asynccontextmanager
async def updating(**options: Any) -> AsyncIterator[tuple[RolloutRunner, FakeEngine, VirtualClock, list[Any],
                                                          WeightUpdater, SparsePublisher]]:
    """The twin with a weight updater and a sparse publisher to announce from; both closed on the way out."""
    runner, engine, clock, sent = setup()
    updater = WeightUpdater(runner, engine, executor_id="ex", secret=SECRET, send=sent.append, **options)
    publisher = SparsePublisher(secret=SECRET, host="127.0.0.1", port=0)
    try:
        yield runner, engine, clock, sent, updater, publisher
    finally:
        publisher.close()
        await updater.close()


async def applied_reply(sent: list[Any], version: int, clock: VirtualClock | None = None) -> WeightApplied:
    for _ in range(3000):
        found = [m for m in sent if isinstance(m, WeightApplied) and m.version == version]
        if found:
            return found[0]
        if clock is not None:
            await clock.advance(0.01)
        await asyncio.sleep(0.002)
    raise AssertionError(f"no WeightApplied for version {version}")


async def test_running_turns_finish_on_their_version_then_the_engine_commits_in_place() -> None:
    """No needless aborts: a running turn ends on version 0; the engine is never paused or reloaded."""
    async with updating() as (runner, engine, clock, sent, updater, publisher):
        runner.submit(turn("busy", max_tokens=20))
        await clock.advance(0.01)
        updater.announce(publisher.publish(1, step=1, tensors=tensors(1)))
        applied = await applied_reply(sent, 1, clock)
        assert (applied.ok, applied.aborted_turns, applied.full_sync) == (True, 0, True)
        busy = next(m for m in sent if isinstance(m, TurnResult) and m.turn_id == "busy")
        assert busy.weight_version == 0  # finished on the weights it started on
        assert engine.calls == ["stage_weights(v1)", "commit_weights(v1)", "reset_prefix_cache"]  # no pause, no reload
        assert runner.weight_version == 1 and not updater.updating
        runner.submit(turn("old", version=0))
        assert [m.reason for m in replies(sent, "old")] == ["version"]
        runner.submit(turn("new", version=1))
        await clock.run_until(lambda: bool(replies(sent, "new")))
        assert replies(sent, "new")[0].weight_version == 1


async def test_a_turn_past_the_drain_timeout_is_given_back_and_the_version_lands() -> None:
    async with updating(drain_timeout_s=0.05) as (runner, _engine, clock, sent, updater, publisher):
        runner.submit(turn("long", max_tokens=900))
        await clock.advance(0.01)
        updater.announce(publisher.publish(1, step=1, tensors=tensors(1)))
        applied = await applied_reply(sent, 1)  # the virtual clock stands still: the turn cannot finish
        assert (applied.ok, applied.aborted_turns) == (True, 1)
        assert [m.reason for m in replies(sent, "long")] == ["weight_update"]
        assert applied.drain_seconds >= 0.05


async def test_weight_applied_says_where_the_seconds_went_and_what_the_engine_holds() -> None:
    """Two versions through rose-transfer onto the twin: whole, then patches; the digest is the trainer's."""
    async with updating() as (_runner, engine, _clock, sent, updater, publisher):
        first_announce = publisher.publish(1, step=1, tensors=tensors(1))
        updater.announce(first_announce)
        first = await applied_reply(sent, 1)
        second_announce = publisher.publish(2, step=2, tensors=tensors(2))
        updater.announce(second_announce)
        second = await applied_reply(sent, 2)
        for applied, announce in ((first, first_announce), (second, second_announce)):
            assert (applied.ok, applied.error) == (True, "")
            assert applied.weights_digest == announce.manifest_digest
            parts = (applied.drain_seconds, applied.commit_seconds, applied.retransform_seconds)
            assert min(parts) >= 0 and applied.commit_seconds <= applied.apply_seconds
            assert applied.queue_seconds >= 0 and applied.transfer_seconds > 0
            assert applied.transfer_seconds + applied.apply_seconds <= applied.seconds + 1e-6
        assert first.full_sync and first.bytes_received >= 4096 * 4
        assert not second.full_sync and second.bytes_received < first.bytes_received // 10
        np.testing.assert_array_equal(engine.weights.arrays()["w"], tensors(2)["w"])


class LateToCommit(FakeEngine):
    """An engine that picks the commit up only after its pull is done and it finished a step (as a
    vLLM worker does between steps): the commit call's first part overlaps the pull."""

    async def commit_weights(self, version: int, timeout_s: float) -> WeightCommit:
        if self._staging is not None:
            await asyncio.wait({self._staging})
        await asyncio.sleep(0.02)
        return await super().commit_weights(version, timeout_s)


async def test_the_pull_and_the_apply_are_not_counted_twice_when_the_commit_waits_for_the_engine() -> None:
    """``transfer + apply`` fits the executor's own seconds (so ``queue <= wait`` on the controller's side):
    the part of the commit call the pull overlapped is the pull's, not the apply's."""
    runner, engine, _clock, sent = setup(engine_type=LateToCommit)
    updater = WeightUpdater(runner, engine, executor_id="ex", secret=SECRET, send=sent.append)
    publisher = SparsePublisher(secret=SECRET, host="127.0.0.1", port=0)
    big = {"w": np.arange(1 << 22, dtype=np.float32)}  # 16 MB: the pull outlasts the (empty) drain
    try:
        updater.announce(publisher.publish(1, step=1, tensors=big))
        applied = await applied_reply(sent, 1)
    finally:
        publisher.close()
        await updater.close()
    assert applied.ok and applied.transfer_seconds > 0
    assert applied.apply_seconds >= 0.02  # the engine's step before the commit is the apply's
    assert applied.transfer_seconds + applied.apply_seconds <= applied.seconds


async def test_a_rotted_base_rolls_the_engine_back_and_the_version_is_pulled_again() -> None:
    async with updating() as (_runner, engine, _clock, sent, updater, publisher):
        updater.announce(publisher.publish(1, step=1, tensors=tensors(1)))
        await applied_reply(sent, 1)
        engine.weights.stream[8] ^= 0x01  # the held base rotted: its patch cannot reconstruct the bucket
        announce = publisher.publish(2, step=2, tensors=tensors(2))
        updater.announce(announce)
        applied = await applied_reply(sent, 2)
        assert applied.ok and applied.weights_digest == announce.manifest_digest
        np.testing.assert_array_equal(engine.weights.arrays()["w"], tensors(2)["w"])


async def test_an_unreachable_source_reports_the_failure_and_keeps_the_version() -> None:
    runner, engine, clock, sent = setup()
    updater = WeightUpdater(runner, engine, executor_id="ex", secret=SECRET, send=sent.append, fetch_timeout_s=5)
    publisher = SparsePublisher(secret=SECRET, host="127.0.0.1", port=0)
    announce = publisher.publish(1, step=1, tensors=tensors(1))
    publisher.close()
    try:
        updater.announce(announce)
        applied = await applied_reply(sent, 1)
        assert not applied.ok and applied.error
        assert runner.weight_version == 0 and engine.weights_loaded == 0
        runner.submit(turn("still", version=0))
        await clock.run_until(lambda: bool(replies(sent, "still")))
        assert replies(sent, "still")[0].weight_version == 0
    finally:
        await updater.close()
