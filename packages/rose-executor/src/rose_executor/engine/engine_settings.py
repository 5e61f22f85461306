"""The ``EngineSpec`` of one engine from the executor config and the resolved device: the GPU / CPU rules of
docs/executor.md ("Engine settings") in one place.

- Both engines share the device and its tensor parallelism.
- GPU: the serving engine takes ``[serving] memory_fraction`` of each device, the rollout engine
  ``[rollout] memory_fraction``; CUDA graphs unless ``cuda_graphs = false``; the rollout engine (never the
  serving one) starts with sleep mode when ``[rollout] sleep_mode``. KV cache: ``kv_cache_gib`` when > 0, else
  what the fraction leaves.
- CPU: eager, no sleep mode, KV cache ``kv_cache_gib`` (1 GiB when 0).
"""

from __future__ import annotations

from pathlib import Path

from rose_core.config.executor_config import ExecutorConfig
from rose_executor.engine.engine_spec import EngineSpec, Purpose
from rose_executor.host.device import Device

CPU_KV_CACHE_GIB = 1.0
"""The KV cache of a CPU engine when the config leaves ``kv_cache_gib`` at 0."""


def engine_spec_for(config: ExecutorConfig, device: Device, model_dir: Path, purpose: Purpose) -> EngineSpec:
    """How to build this host's ``purpose`` engine for ``model_dir``."""
    rollout = purpose == "rollout"
    fraction = config.rollout.memory_fraction if rollout else config.serving.memory_fraction
    return EngineSpec(
        model_dir=model_dir,
        purpose=purpose,
        kv_cache_gib=config.kv_cache_gib or (0.0 if device.on_gpu else CPU_KV_CACHE_GIB),
        max_num_seqs=config.rollout.capacity if rollout else config.serving.max_num_seqs,
        max_model_len=config.max_model_len,
        enable_prefix_caching=config.enable_prefix_caching,
        dtype=config.dtype,
        served_model_name="" if rollout else config.serving.model_name,
        prefill_chunk_tokens=config.rollout.prefill_chunk_tokens if rollout else 0,
        device=device.setting,
        tensor_parallel_size=device.tensor_parallel_size,
        gpu_memory_utilization=fraction if device.on_gpu else 0.0,
        enforce_eager=not (device.on_gpu and config.cuda_graphs),
        enable_sleep_mode=rollout and device.on_gpu and config.rollout.sleep_mode,
    )
