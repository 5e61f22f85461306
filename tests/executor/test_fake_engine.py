"""The FakeEngine twin on a virtual clock: token timing follows its latency model, a pause holds between steps,
an abort ends the request, live requests carry the right stamps, prefix caching and weight reloads behave."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rose_core.policy import LatencyModel
from rose_core.protocol.messages import SamplingParams
from rose_core.support.errors import RoseError
from rose_executor.engine.engine_protocol import Engine, GenerationOutput, WeightOrder
from rose_executor.engine.engine_spec import EngineSpec
from rose_executor.testing.fake_engine import FAKE_MODEL_DIR, FakeEngine, FakeEngineLauncher
from rose_executor.testing.virtual_clock import VirtualClock
from rose_transfer import DensePublisher

MODEL = LatencyModel(prefill_base_s=0.004, prefill_per_token_s=10e-6, decode_base_s=0.002, decode_per_seq_s=0.001)


class Stats:
    def __init__(self) -> None:
        self.ttfts: list[float] = []
        self.itls: list[float] = []
        self.finished: list[tuple[float, float]] = []

    def on_iteration(
        self, ttfts: Sequence[float], tpots: Sequence[float], finished: Sequence[tuple[float, float]]
    ) -> None:
        self.ttfts += ttfts
        self.itls += tpots
        self.finished += finished

    def on_scheduler(self, kv_usage_ratio: float) -> None:
        return None


def engine(max_num_seqs: int = 16, max_batched_tokens: int = 2048) -> tuple[FakeEngine, VirtualClock]:
    clock = VirtualClock(10.0)
    spec = EngineSpec(model_dir=FAKE_MODEL_DIR, max_num_seqs=max_num_seqs)
    return FakeEngine(MODEL, clock, spec, max_batched_tokens=max_batched_tokens), clock


def generate(fake: FakeEngine, rid: str, prompt_tokens: int, max_tokens: int) -> asyncio.Task[GenerationOutput]:
    prompt = [(i * 7) % 150 + 3 for i in range(prompt_tokens)]
    return asyncio.create_task(fake.generate(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0)))


def test_the_twin_is_an_engine() -> None:
    twin: Engine = FakeEngine(MODEL, VirtualClock())  # mypy checks the protocol here
    assert twin.spec.purpose == "rollout" and not twin.errored


async def test_token_timing_follows_the_latency_model() -> None:
    fake, clock = engine()
    stats = Stats()
    fake.attach_observer(stats)
    task = generate(fake, "a", 100, 5)
    await clock.run_until(task.done)
    out = task.result()
    assert len(out.token_ids) == 5 and out.finish_reason == "length" and len(out.logprobs) == 5
    assert clock.now() == pytest.approx(10.0 + MODEL.prefill_s(100) + 4 * MODEL.decode_step_s(1))
    assert stats.ttfts == [pytest.approx(MODEL.prefill_s(100))]
    assert stats.itls == [pytest.approx(MODEL.decode_step_s(1))] * 4
    assert stats.finished == [(pytest.approx(MODEL.prefill_s(100)), pytest.approx(MODEL.decode_step_s(1)))]


async def test_a_long_prompt_is_prefilled_in_chunks_and_sequences_decode_together() -> None:
    fake, clock = engine(max_batched_tokens=512)
    task = generate(fake, "long", 1000, 1)
    await clock.run_until(task.done)
    assert clock.now() == pytest.approx(10.0 + MODEL.prefill_s(1000, 512))  # two chunks, one step overhead each
    await fake.pause(keep_requests=True)  # both arrive before the next step starts
    a, b = generate(fake, "a", 8, 3), generate(fake, "b", 8, 3)
    await asyncio.sleep(0)
    await fake.resume()
    started = clock.now()
    await clock.run_until(lambda: a.done() and b.done())
    assert clock.now() == pytest.approx(started + MODEL.step_s(0, 16) + 2 * MODEL.decode_step_s(2))


async def test_live_requests_carry_prefilling_and_token_stamps() -> None:
    fake, clock = engine()
    task = generate(fake, "a", 64, 3)
    await asyncio.sleep(0)
    (live,) = fake.live_requests()
    assert (live.arrival_s, live.prompt_tokens, live.max_tokens, live.tokens_out) == (10.0, 64, 3, 0)
    assert live.prefilling and live.last_token_s is None
    first = 10.0 + MODEL.prefill_s(64)
    await clock.advance(MODEL.prefill_s(64))
    (live,) = fake.live_requests()
    assert not live.prefilling and live.tokens_out == 1 and live.last_token_s == pytest.approx(first)
    await clock.run_until(task.done)
    assert fake.live_requests() == [] and fake.num_unfinished_requests() == 0


async def test_max_num_seqs_keeps_the_rest_waiting() -> None:
    fake, clock = engine(max_num_seqs=1)
    a, b = generate(fake, "a", 8, 2), generate(fake, "b", 8, 2)
    await clock.run_until(a.done)
    assert not b.done() and [r.request_id for r in fake.live_requests()] == ["b"]
    await clock.run_until(b.done)


async def test_pause_holds_after_the_step_in_flight_and_resume_continues() -> None:
    fake, clock = engine()
    task = generate(fake, "a", 8, 20)
    await clock.run_until(lambda: fake.live_requests()[0].tokens_out == 3)
    await clock.advance(MODEL.decode_step_s(1) / 2)  # mid-step
    await fake.pause(keep_requests=True)
    assert await fake.is_paused()
    await clock.advance(60.0)
    (live,) = fake.live_requests()
    assert live.tokens_out == 4 and not task.done()  # the step in flight landed; nothing after it
    await fake.resume()
    await clock.run_until(task.done)
    assert len(task.result().token_ids) == 20 and fake.calls == ["pause(keep=True)", "resume"]


async def test_abort_ends_the_request_with_what_it_generated() -> None:
    fake, clock = engine()
    task = generate(fake, "a", 8, 100)
    await clock.run_until(lambda: fake.live_requests()[0].tokens_out == 5)
    await fake.abort("a")
    out = await task
    assert (out.finish_reason, len(out.token_ids)) == ("abort", 5)
    assert fake.live_requests() == [] and fake.aborted == ["a"]
    cancelled = generate(fake, "b", 8, 100)
    await clock.advance(0.05)
    cancelled.cancel()  # cancelling the call aborts the request, as with vLLM
    await asyncio.gather(cancelled, return_exceptions=True)
    assert fake.aborted == ["a", "b"] and fake.num_unfinished_requests() == 0
    await clock.advance(1.0)  # the step that was in flight ends without it


async def test_pause_without_keep_aborts_everything() -> None:
    fake, clock = engine()
    tasks = [generate(fake, name, 8, 100) for name in ("a", "b")]
    await clock.advance(0.02)
    await fake.pause()
    outs = await asyncio.gather(*tasks)
    assert [o.finish_reason for o in outs] == ["abort", "abort"] and await fake.is_paused()


async def test_releasing_memory_aborts_and_drops_the_cache_and_restoring_schedules_again() -> None:
    """Like vLLM's sleep level 1 and wake-up on a CUDA engine started with sleep mode."""
    clock = VirtualClock(10.0)
    fake = FakeEngine(MODEL, clock, EngineSpec(model_dir=FAKE_MODEL_DIR), can_release_memory=True)
    warm = generate(fake, "warm", 300, 1)
    await clock.run_until(warm.done)
    running = generate(fake, "a", 8, 100)
    await clock.advance(0.02)
    await fake.release_memory()
    await fake.release_memory()  # a second call is a no-op
    assert (await running).finish_reason == "abort" and fake.memory_released and await fake.is_paused()
    waiting = generate(fake, "b", 300, 2)
    await clock.advance(60.0)
    assert not waiting.done()  # accepted, not scheduled while released
    await fake.restore_memory()
    await clock.run_until(waiting.done)
    assert waiting.result().num_cached_tokens == 0  # the prefix cache went with the KV cache
    assert not fake.memory_released and not await fake.is_paused()
    await fake.restore_memory()  # nothing to restore: a no-op
    assert fake.calls == ["release_memory", "release_memory", "restore_memory", "restore_memory"]


async def test_a_twin_without_memory_release_refuses_like_a_cpu_engine() -> None:
    fake, _ = engine()
    assert fake.can_release_memory is False
    with pytest.raises(RoseError, match="built with can_release_memory=False"):
        await fake.release_memory()
    with pytest.raises(RoseError, match="cannot restore the memory"):
        await fake.restore_memory()
    assert fake.calls == []


async def test_the_launcher_lets_a_sleep_mode_spec_release_memory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    launcher = FakeEngineLauncher({"rollout": MODEL, "serving": MODEL}, VirtualClock())
    asleep = EngineSpec(model_dir=tmp_path, device="cuda", gpu_memory_utilization=0.3, enable_sleep_mode=True)
    assert (await launcher.start(asleep)).can_release_memory is True
    assert (await launcher.start(EngineSpec(model_dir=tmp_path))).can_release_memory is False


async def test_listeners_hear_arrivals_and_finishes() -> None:
    fake, clock = engine()
    heard: list[int] = []
    fake.add_activity_listener(lambda: heard.append(fake.num_unfinished_requests()))
    task = generate(fake, "a", 8, 2)
    await asyncio.sleep(0)
    assert heard == [1]  # the request is in the engine when the listener runs
    await clock.run_until(task.done)
    assert heard == [1, 0]


async def test_prefix_cache_and_a_weight_commit() -> None:
    fake, clock = engine()
    first = generate(fake, "p1", 300, 2)
    await clock.run_until(first.done)
    second = generate(fake, "p2", 300, 2)
    await clock.run_until(second.done)
    assert first.result().num_cached_tokens == 0 and second.result().num_cached_tokens == 256
    assert second.result().token_ids == first.result().token_ids  # same prompt, same weights
    secret = b"f" * 32
    with DensePublisher(secret=secret, host="127.0.0.1", port=0) as publisher:
        announce = publisher.publish(1, 1, {"w": np.arange(100, dtype=np.float32)})
        await fake.stage_weights(WeightOrder(announce, secret, "fake"))
        commit = await fake.commit_weights(1, 10.0)
    assert (commit.version, commit.full_sync, commit.digest) == (1, True, announce.manifest_digest)
    fake.prefix_reset_ok = False  # KV blocks in use: the cache stays
    assert not await fake.reset_prefix_cache()
    kept = generate(fake, "p4", 300, 2)
    await clock.run_until(kept.done)
    assert kept.result().num_cached_tokens == 256
    fake.prefix_reset_ok = True
    assert await fake.reset_prefix_cache()
    third = generate(fake, "p3", 300, 2)
    await clock.run_until(third.done)
    assert third.result().num_cached_tokens == 0  # the reset dropped the prefix cache
    assert third.result().token_ids != first.result().token_ids  # new weights, new tokens
    assert fake.calls == ["stage_weights(v1)", "commit_weights(v1)", "reset_prefix_cache", "reset_prefix_cache"]
    with pytest.raises(RoseError, match="never staged"):
        await fake.commit_weights(2, 1.0)
