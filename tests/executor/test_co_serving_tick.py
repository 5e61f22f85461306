"""The co-serving control tick with the real RolloutRunner and policies on the FakeEngine twin and a virtual clock:
admitted turns start, a vanished slack pauses the rollout engine within the tick, a memory cut aborts, an idle
policy sits inactive, and the control loop ticks at once on a serving arrival or a submitted turn."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from rose_core.policy import (
    AdmissionConfig,
    CoServingGuard,
    DualSlackAdmission,
    GuardSettings,
    LatencyModel,
    MemoryPolicyConfig,
    SloBudgets,
)
from rose_core.protocol.messages import SamplingParams, TurnAborted, TurnRequest, WeightApplied
from rose_executor.co_serving.co_serving import CoServing, PendingGuard
from rose_executor.engine.engine_protocol import GenerationOutput
from rose_executor.memory.serving_first_budget import ModelFootprint, ServingFirstBudget
from rose_executor.rollout.rollout_runner import RolloutRunner
from rose_executor.testing.fake_engine import FakeEngine
from rose_executor.testing.virtual_clock import VirtualClock
from rose_executor.weights.weight_updater import WeightUpdater
from rose_transfer import SparsePublisher

MODEL = LatencyModel(0.004, 10e-6, 0.002, 0.001)
GREEDY = SamplingParams(max_tokens=64, temperature=0.0)


def setup(
    memory: ServingFirstBudget | None = None, *, can_release_memory: bool = False,
) -> tuple[CoServing, FakeEngine, FakeEngine, list[Any], VirtualClock]:
    """Both engines are twins on one virtual clock (starting at 99.9 s); the runner and the loop read it too.
    ``can_release_memory``: the rollout twin sleeps like vLLM on a GPU with sleep mode."""
    clock = VirtualClock(99.9)
    sent: list[Any] = []
    serving = FakeEngine(MODEL, clock)
    rollout = FakeEngine(MODEL, clock, can_release_memory=can_release_memory)
    runner = RolloutRunner(rollout, "ex", 4, sent.append, clock=clock.now, guarded=True, memory=memory)
    guard = CoServingGuard(DualSlackAdmission(AdmissionConfig(0.5, 0.05), MODEL, MODEL))
    return CoServing(guard, serving, rollout, runner, 0.05, memory, clock), serving, rollout, sent, clock


def serve(engine: FakeEngine, name: str, prompt_tokens: int, max_tokens: int = 64) -> asyncio.Task[GenerationOutput]:
    """A serving request on the twin (its arrival calls the activity listeners, as vLLM's add_request does)."""
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return asyncio.create_task(engine.generate(name, [5] * prompt_tokens, sampling))


def turn(name: str, max_tokens: int = 100) -> TurnRequest:
    return TurnRequest(
        turn_id=name, trajectory_id=f"t-{name}", attempt=0, prompt_token_ids=np.arange(20, dtype=np.int32),
        sampling=SamplingParams(max_tokens=max_tokens), min_version=0, max_version=0,
    )  # fmt: skip


async def test_admit_hold_within_one_tick_and_resume() -> None:
    co, serving, rollout, _, clock = setup()
    co.runner.submit(turn("a"))
    await asyncio.sleep(0)
    assert rollout.started == [] and co.runner.queued()  # guarded: waits for the tick
    await co.tick(100.0)
    await asyncio.sleep(0)
    assert rollout.started == ["a:0"] and co.headroom
    request = serve(serving, "s", 8)  # 8-token prompt; let it emit 5 tokens on the virtual clock
    await clock.run_until(lambda: [r.tokens_out for r in serving.live_requests()] == [5])
    co.runner.submit(turn("b"))
    held = await co.tick(100.05)  # over 50 ms after the last serving token: TPOT slack gone
    assert not held.run_rollout and rollout.calls == ["pause(keep=True)"] and co.runner.held
    assert [q.key for q in co.runner.queued()] == ["b:0"]
    assert co.held_turns() == 2  # the heartbeat's rollout_held: b waits, a is paused in the engine
    await serving.abort("s")
    await request
    await co.tick(100.1)
    await asyncio.sleep(0)
    assert rollout.calls == ["pause(keep=True)", "resume"] and rollout.started == ["a:0", "b:0"]
    assert co.held_turns() == 0
    await co.runner.abort_all("shutdown")


async def test_memory_cut_aborts_the_youngest_and_freezes_until_the_step() -> None:
    kv = 100  # bytes per token, both models; a turn reserves (20 + 100) x 100 = 12 kB
    policy = MemoryPolicyConfig(device_bytes=100_000, rollout_weight_bytes=10_000, high_watermark=0.5)
    memory = ServingFirstBudget(policy, ModelFootprint(40_000, kv), ModelFootprint(10_000, kv))
    co, serving, _, sent, clock = setup(memory)
    assert memory.budget_bytes == 30_000  # 100 k - 10 k rollout weights - 40 k serving - 20 k headroom
    for name in ("a", "b"):
        co.runner.submit(turn(name))
        await co.tick(float(len(sent) + ord(name)))
        await clock.advance(0.001)  # b starts after a: the younger one
    await asyncio.sleep(0)
    assert len(co.runner.memory_uses()) == 2
    request = serve(serving, "s", 100, max_tokens=20)  # prefilling, reserves (100 + 20) x 100 = 12 kB >= 10 k
    await asyncio.sleep(0)
    await co.tick(200.0)
    await asyncio.sleep(0)
    assert memory.frozen and memory.budget_bytes == 15_000
    aborted = [m for m in sent if isinstance(m, TurnAborted)]
    assert [(m.turn_id, m.reason) for m in aborted] == [("b", "memory")]
    co.runner.submit(turn("c"))  # 12 kB + 12 kB > 15 kB: refused at once
    assert isinstance(sent[-1], TurnAborted) and (sent[-1].turn_id, sent[-1].reason) == ("c", "memory")
    await serving.abort("s")
    await request
    co.on_step(1)
    assert not memory.frozen and memory.budget_bytes == 30_000
    await co.runner.abort_all("shutdown")


async def test_where_the_engine_can_release_a_cut_gives_every_turn_back_and_releases_until_the_step() -> None:
    """On a GPU (sleep mode) the rollout engine's KV pool is fixed: giving back the youngest turn frees no device
    memory. So the cut gives back every turn and releases the engine's memory; turns submitted meanwhile wait
    (held) on the released engine until the budget thaws at the next step, then it is restored and they run."""
    kv = 100
    policy = MemoryPolicyConfig(device_bytes=100_000, rollout_weight_bytes=10_000, high_watermark=0.5)
    memory = ServingFirstBudget(policy, ModelFootprint(40_000, kv), ModelFootprint(10_000, kv))
    co, serving, rollout, sent, clock = setup(memory, can_release_memory=True)
    for name in ("a", "b"):
        co.runner.submit(turn(name))
        await co.tick(float(len(sent) + ord(name)))
        await clock.advance(0.001)
    await asyncio.sleep(0)
    assert len(co.runner.memory_uses()) == 2 and not rollout.memory_released
    request = serve(serving, "s", 100, max_tokens=20)
    await asyncio.sleep(0)
    await co.tick(200.0)
    await asyncio.sleep(0)
    aborted = sorted((m.turn_id, m.reason) for m in sent if isinstance(m, TurnAborted))
    assert aborted == [("a", "memory"), ("b", "memory")] and memory.frozen
    assert rollout.memory_released and co.engine_memory.released
    co.runner.submit(turn("c", max_tokens=10))  # fits the cut budget: admitted, held on the released engine
    for now in (200.05, 200.1):
        await co.tick(now)
        await asyncio.sleep(0)
    assert rollout.memory_released and [q.key for q in co.runner.queued()] == ["c:0"] and co.held_turns() == 1
    await serving.abort("s")
    await request
    co.on_step(1)
    await co.tick(200.15)
    await asyncio.sleep(0)
    assert not rollout.memory_released and "restore_memory" in rollout.calls and "c:0" in rollout.started
    await co.runner.abort_all("shutdown")


async def test_idle_policy_sits_inactive_and_the_first_turn_activates_it() -> None:
    co, _, rollout, _, _ = setup()
    verdict = await co.tick(100.0)  # no turn: loaded but inactive, the engine held, nothing reserved
    assert verdict.run_rollout and not co.active and co.paused and rollout.calls == ["pause(keep=True)"]
    assert co.runner.memory_uses() == []
    co.runner.submit(turn("a"))
    await co.tick(100.01)
    await asyncio.sleep(0)
    assert co.active and not co.paused and rollout.calls[-1] == "resume" and rollout.started == ["a:0"]
    await co.runner.abort_all("shutdown")
    await co.tick(100.02)
    assert not co.active and co.paused and rollout.calls[-1] == "pause(keep=True)"


async def settle(condition: Callable[[], bool]) -> None:
    """Let the event loop run until ``condition`` holds (bounded by iterations, not by time)."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the control loop did not react")


async def test_the_loop_ticks_at_once_on_a_submitted_turn_and_on_a_serving_arrival() -> None:
    co, serving, rollout, _, _ = setup()
    co.interval_s = 3600.0  # no periodic tick during the test (the clock never moves): only wake-ups
    loop = asyncio.create_task(co.run())
    try:
        await settle(lambda: rollout.calls == ["pause(keep=True)"])  # the first tick: idle, inactive
        co.runner.submit(turn("a"))
        await settle(lambda: rollout.started == ["a:0"])  # the submission woke the loop
        assert rollout.calls == ["pause(keep=True)", "resume"]
        # A prompt whose prefill alone (118 chunks) outlasts the 0.5 s TTFT budget: no slack from its arrival on,
        # which calls the listeners (as VllmEngine's add_request does).
        serve(serving, "s", 60_000)
        await settle(lambda: rollout.calls[-1] == "pause(keep=True)")
        assert co.runner.held
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await co.runner.abort_all("shutdown")
        serving.shutdown()
    assert serving.listeners == [] and co.runner._submit_listeners == []


async def test_a_weight_update_leaves_the_guards_pause_state_true() -> None:
    """The guard alone pauses and resumes the rollout engine: the control loop ticking while a version is
    committed to the held idle engine keeps it held, and the turn that arrives right after the update runs
    (a tick during an update used to forget the hold: the engine stayed paused with the turn in it)."""
    co, _, rollout, sent, clock = setup()
    secret = b"g" * 32
    updater = WeightUpdater(co.runner, rollout, executor_id="ex", secret=secret, send=sent.append)
    release = asyncio.Event()
    real_commit = rollout.commit_weights

    async def commit(version: int, timeout_s: float) -> Any:
        await release.wait()
        return await real_commit(version, timeout_s)

    rollout.commit_weights = commit  # type: ignore[method-assign]
    loop = asyncio.create_task(co.run())  # the real control loop, ticking every 50 ms of the clock
    with SparsePublisher(secret=secret, host="127.0.0.1", port=0) as publisher:
        await clock.advance(0.1)
        assert co.paused and await rollout.is_paused()  # inactive: held
        updater.announce(publisher.publish(1, 1, {"w": np.arange(64, dtype=np.float32)}))
        while not updater.updating:
            await asyncio.sleep(0.001)
        await clock.advance(0.2)  # the loop ticks during the update
        release.set()
        while not any(isinstance(m, WeightApplied) for m in sent):
            await asyncio.sleep(0.001)  # the clock stands still: no tick after the update
    assert next(m for m in sent if isinstance(m, WeightApplied)).ok
    assert co.paused == await rollout.is_paused()
    co.runner.submit(TurnRequest(
        turn_id="after", trajectory_id="t-after", attempt=0, prompt_token_ids=np.arange(20, dtype=np.int32),
        sampling=SamplingParams(max_tokens=4), min_version=1, max_version=1,
    ))  # fmt: skip
    await clock.run_until(lambda: any(getattr(m, "turn_id", "") == "after" for m in sent), timeout_s=5)
    assert next(m for m in sent if getattr(m, "turn_id", "") == "after").weight_version == 1
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
    await updater.close()


async def test_hold_time_is_counted_and_sustained_pressure_calls_for_revocation_once() -> None:
    """While serving has no slack the waiting turn's hold time adds up; after ``revoke_after_s`` without a
    break the callback fires, once; headroom coming back resets the pressure clock."""
    co, serving, _rollout, _, clock = setup()
    calls: list[float] = []
    co.revoke_after_s, co.on_sustained_pressure = 0.3, calls.append
    request = serve(serving, "s", 8)
    await clock.run_until(lambda: [r.tokens_out for r in serving.live_requests()] == [5])
    co.runner.submit(turn("w"))
    base = 100.125
    for i in range(5):  # 1/8 s apart, every one without slack (the serving request is stalled on the clock)
        verdict = await co.tick(base + 0.125 * i)
        assert not verdict.headroom and not verdict.start and co.runner.held
    assert co.hold_seconds_total == 0.5
    assert calls == [0.375]  # the first tick past 0.3 s, and only once
    await serving.abort("s")
    await request
    await co.tick(base + 0.75)
    assert co.pressure_since is None
    await co.runner.abort_all("shutdown")


async def test_while_the_slo_is_measured_nothing_is_lent_and_no_pressure_counts() -> None:
    """A host measuring its SLO (``[slo] from_alone``) holds every turn, reports no headroom and counts no
    pressure toward revocation; the tick after the SLO is known builds the guard with it and lends."""
    co, _serving, rollout, _, _clock = setup()
    measured: list[SloBudgets] = []
    built: list[SloBudgets] = []

    def build(slo: SloBudgets) -> CoServingGuard:
        built.append(slo)
        return CoServingGuard.build(GuardSettings(slo), MODEL, MODEL)

    co = CoServing(PendingGuard(lambda: measured[0] if measured else None, build), co.serving, rollout, co.runner,
                   0.05, clock=co.clock)
    calls: list[float] = []
    co.revoke_after_s, co.on_sustained_pressure = 0.1, calls.append
    co.runner.submit(turn("m"))
    for i in range(4):
        verdict = await co.tick(100.0 + 0.1 * i)
        assert not verdict.headroom and not verdict.start and co.guard is None
    await asyncio.sleep(0)
    assert rollout.started == [] and co.held_turns() == 1 and calls == [] and co.pressure_since is None
    assert co.hold_seconds_total > 0  # a held turn's wait is still hold time
    measured.append(SloBudgets(0.5, 0.05))
    verdict = await co.tick(100.5)
    await asyncio.sleep(0)
    assert built == [SloBudgets(0.5, 0.05)] and co.guard is not None
    assert verdict.headroom and rollout.started == ["m:0"]
    await co.runner.abort_all("shutdown")


async def test_without_the_guard_turns_run_whatever_serving_does() -> None:
    """``[slo] guard = false`` (the co-location baseline): where the guard holds (serving has no TPOT slack),
    the unguarded host starts the turn and keeps its engine running, and reports headroom."""
    co, serving, rollout, _, clock = setup()
    request = serve(serving, "s", 8)
    await clock.run_until(lambda: [r.tokens_out for r in serving.live_requests()] == [5])
    co.runner.submit(turn("g"))
    assert not (await co.tick(100.05)).start  # guarded: held
    co.unguarded = True
    verdict = await co.tick(100.1)
    await asyncio.sleep(0)
    assert verdict.start == ("g:0",) and verdict.run_rollout and verdict.headroom
    assert rollout.started == ["g:0"] and not co.paused
    await serving.abort("s")
    await request
    await co.runner.abort_all("shutdown")


async def test_the_inactive_engine_releases_its_memory_and_a_turn_or_an_update_wakes_it() -> None:
    """GPU sleep mode on the twin: inactive -> released; a submitted turn restores it before the guard admits
    it; a weight update restores a released engine before it stages and keeps it awake until it is done."""
    co, _, rollout, sent, clock = setup(can_release_memory=True)
    await co.tick(100.0)
    assert co.engine_memory.released and rollout.memory_released and rollout.calls[-1] == "release_memory"
    co.runner.submit(turn("wake", max_tokens=4))
    await co.tick(100.01)
    assert not rollout.memory_released and "restore_memory" in rollout.calls
    await clock.run_until(lambda: any(getattr(m, "turn_id", "") == "wake" for m in sent), timeout_s=5)
    await co.tick(100.5)
    assert co.engine_memory.released  # inactive again: released again
    secret = b"h" * 32
    updater = WeightUpdater(co.runner, rollout, executor_id="ex", secret=secret, send=sent.append,
                            engine_memory=co.engine_memory)
    real_commit = rollout.commit_weights
    ticks_during_commit: list[bool] = []

    async def commit(version: int, timeout_s: float) -> Any:
        await co.tick(101.0)  # the guard ticks mid-update: it must not release the engine under the commit
        ticks_during_commit.append(rollout.memory_released)
        return await real_commit(version, timeout_s)

    rollout.commit_weights = commit  # type: ignore[method-assign]
    with SparsePublisher(secret=secret, host="127.0.0.1", port=0) as publisher:
        updater.announce(publisher.publish(1, 1, {"w": np.arange(64, dtype=np.float32)}))
        while not any(isinstance(m, WeightApplied) for m in sent):
            await asyncio.sleep(0.001)
    assert next(m for m in sent if isinstance(m, WeightApplied)).ok and ticks_during_commit == [False]
    calls = rollout.calls
    assert calls.index("stage_weights(v1)") > len(calls) - 1 - calls[::-1].index("restore_memory")
    await co.tick(102.0)
    assert co.engine_memory.released  # the update is over: inactive, released again
    await updater.close()
