"""The vLLM adapter on a real CPU engine: generation from token ids, abort, in-place weight reload."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from safetensors.torch import load_file, save_file

from rose_core.messages import SamplingParams
from rose_executor.engine.vllm_engine import VllmEngine
from rose_executor.engine.weight_file import flat_file_from_safetensors

pytestmark = pytest.mark.asyncio(loop_scope="module")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
PROMPT = [7, 21, 33, 45, 58, 61, 70, 85, 99]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(policy_dir: Path) -> AsyncIterator[VllmEngine]:
    started = time.perf_counter()
    engine = await VllmEngine.create(
        policy_dir, purpose="rollout", kv_cache_gib=0.5, max_num_seqs=8, max_model_len=1024
    )
    print(f"\nrollout engine start (incl. warm-up): {time.perf_counter() - started:.1f} s")
    yield engine
    engine.shutdown()


async def test_generate_from_token_ids(engine: VllmEngine) -> None:
    out = await engine.generate("g1", PROMPT, GREEDY)
    assert 1 <= len(out.token_ids) <= 12
    assert len(out.logprobs) == len(out.token_ids)
    assert all(lp <= 0.0 for lp in out.logprobs)
    assert out.finish_reason in ("length", "stop")
    again = await engine.generate("g2", PROMPT, GREEDY)
    assert again.token_ids == out.token_ids
    assert again.logprobs == out.logprobs


async def test_sampling_options_and_batch(engine: VllmEngine) -> None:
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3, logprobs=False)
    outs = await asyncio.gather(*(engine.generate(f"b{i}", [*PROMPT, i], params) for i in range(6)))
    assert all(len(o.token_ids) >= 1 and o.logprobs == [] for o in outs)
    seeded = await engine.generate("b-again", [*PROMPT, 0], params)
    assert seeded.token_ids == outs[0].token_ids


async def test_prefix_cache_hits_are_reported(engine: VllmEngine) -> None:
    prompt = [(i * 7) % 150 + 5 for i in range(300)]
    first = await engine.generate("p1", prompt, SamplingParams(max_tokens=2, temperature=0.0))
    second = await engine.generate("p2", prompt, SamplingParams(max_tokens=2, temperature=0.0))
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens >= 256  # two full 128-token blocks


async def test_abort_stops_a_running_request(engine: VllmEngine) -> None:
    task = asyncio.create_task(engine.generate("long", PROMPT, SamplingParams(max_tokens=900, temperature=0.0)))
    while engine.num_unfinished_requests() == 0:
        await asyncio.sleep(0.005)
    await engine.abort("long")
    out = await asyncio.wait_for(task, 10)
    assert out.finish_reason in ("abort", "stop")
    assert len(out.token_ids) < 900
    assert engine.num_unfinished_requests() == 0


async def test_reload_weights_changes_then_restores_outputs(
    engine: VllmEngine, policy_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    stage = tmp_path_factory.mktemp("stage")
    state = load_file(str(policy_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    perturbed = {
        k: (v.float() + 0.05 * torch.randn(v.shape, generator=generator)).to(v.dtype) for k, v in state.items()
    }
    save_file(perturbed, str(stage / "v1.safetensors"))
    v0 = flat_file_from_safetensors(policy_dir, stage / "v0.bin")
    v1 = flat_file_from_safetensors(stage / "v1.safetensors", stage / "v1.bin")
    before = await engine.generate("r0", PROMPT, GREEDY)

    await engine.pause(clear_cache=True)
    seconds = await engine.reload_weights(stage / "v1.bin", v1)
    await engine.resume()
    changed = await engine.generate("r1", PROMPT, GREEDY)
    assert (changed.token_ids, changed.logprobs) != (before.token_ids, before.logprobs)

    await engine.pause(clear_cache=True)
    seconds_back = await engine.reload_weights(stage / "v0.bin", v0)
    await engine.resume()
    restored = await engine.generate("r2", PROMPT, GREEDY)
    assert restored.token_ids == before.token_ids
    assert restored.logprobs == before.logprobs  # bit-exact: same weights, same kernels
    print(f"\nreload_weights: {seconds:.3f} s and {seconds_back:.3f} s for {sum(e.nbytes for e in v0)} bytes")


async def test_pause_keep_freezes_and_resume_continues(engine: VllmEngine) -> None:
    await engine.pause(keep_requests=True)
    assert await engine.is_paused()
    task = asyncio.create_task(engine.generate("frozen", PROMPT, GREEDY))
    await asyncio.sleep(0.3)
    assert not task.done()
    await engine.resume()
    out = await asyncio.wait_for(task, 10)
    assert out.finish_reason in ("length", "stop")
    assert not await engine.is_paused()


async def test_activity_listener_hears_every_added_request(engine: VllmEngine) -> None:
    heard: list[int] = []

    def listener() -> None:
        heard.append(engine.num_unfinished_requests())

    engine.add_activity_listener(listener)
    try:
        await engine.generate("heard-1", PROMPT, GREEDY)
        await asyncio.gather(*(engine.generate(f"heard-{i}", PROMPT, GREEDY) for i in (2, 3)))
    finally:
        engine.remove_activity_listener(listener)
    assert len(heard) == 3 and heard[0] == 1  # called once the request is in the engine, before it finishes
    await engine.generate("not-heard", PROMPT, GREEDY)
    assert len(heard) == 3
