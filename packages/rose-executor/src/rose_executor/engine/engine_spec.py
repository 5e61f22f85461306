"""How to build one engine: model, purpose and the vLLM sizes the executor sets (no vllm types)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rose_core.config.executor_config import parse_device
from rose_core.support.errors import RoseError

Purpose = Literal["serving", "rollout"]


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """How to build one engine; sizes validated on construction, the model directory when an engine starts
    (``require_model``), so a twin can carry a spec without a model on disk.

    On CPU, ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB), when set, overrides ``kv_cache_gib`` (vLLM's platform code).
    A CPU engine runs eager and without sleep mode (vllm-cpu needs eager and cannot sleep), and sharded only with
    ``VLLM_CPU_OMP_THREADS_BIND`` giving each rank its own cores (``"0|1"``: vLLM's CPU worker binds rank r's
    threads to the r-th list, and without it refuses a host with fewer NUMA nodes than ranks); a CUDA engine takes
    ``gpu_memory_utilization`` of each device, its KV cache sized from it unless ``kv_cache_gib`` > 0.
    """

    model_dir: Path
    purpose: Purpose = "rollout"
    kv_cache_gib: float = 1.0
    """KV cache, GiB; on CUDA 0 lets ``gpu_memory_utilization`` size it."""
    max_num_seqs: int = 16
    max_model_len: int = 1024
    enable_prefix_caching: bool = True
    dtype: str = "bfloat16"
    served_model_name: str = ""
    prefill_chunk_tokens: int = 0
    """Chunked prefill: at most this many tokens per engine step (vLLM's ``max_num_batched_tokens``, raised
    to ``max_num_seqs`` if lower); 0: vLLM's default. The rollout engine runs the guard's admission unit."""
    device: str = "cpu"
    """A resolved device (``engine.device.resolve_device``): ``"cpu"``, ``"cuda"`` (the visible devices from 0)
    or ``"cuda:N"`` (devices N .. N + tensor_parallel_size - 1)."""
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.0
    """CUDA: the share of each device this engine takes (vLLM's own knob); unused on CPU."""
    enforce_eager: bool = True
    """False: vLLM captures CUDA graphs (CUDA only)."""
    enable_sleep_mode: bool = False
    """vLLM's sleep mode, so ``release_memory`` can free the engine's device memory (CUDA only)."""

    def __post_init__(self) -> None:
        if self.purpose not in ("serving", "rollout"):
            raise RoseError(f"engine purpose must be 'serving' or 'rollout', not {self.purpose!r}")
        if self.kv_cache_gib < 0 or self.max_num_seqs < 1 or self.max_model_len < 1:
            raise RoseError("max_num_seqs and max_model_len must be positive, kv_cache_gib >= 0")
        if self.prefill_chunk_tokens < 0:
            raise RoseError("prefill_chunk_tokens must be >= 0 (0: the engine's default)")
        if self.tensor_parallel_size < 1:
            raise RoseError(f"tensor_parallel_size must be >= 1 (got {self.tensor_parallel_size})")
        if self.on_gpu:
            self._check_gpu()
        else:
            self._check_cpu()

    def _check_gpu(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise RoseError(
                f"a CUDA engine needs gpu_memory_utilization in (0, 1] (got {self.gpu_memory_utilization}): "
                "set its memory fraction"
            )

    def _check_cpu(self) -> None:
        if self.kv_cache_gib <= 0:
            raise RoseError("a CPU engine needs kv_cache_gib > 0: its KV cache is sized by it")
        if self.tensor_parallel_size > 1:
            _check_cpu_binding(self.tensor_parallel_size)
        refused = [
            what
            for what, on in (
                ("CUDA graphs (enforce_eager = False)", not self.enforce_eager),
                ("sleep mode", self.enable_sleep_mode),
            )
            if on
        ]
        if refused:
            raise RoseError(
                f"a CPU engine runs eager and without sleep mode, not with {', '.join(refused)}: "
                "those settings are for CUDA engines"
            )

    @property
    def on_gpu(self) -> bool:
        """True for a CUDA engine; ``RoseError`` if ``device`` is not a resolved device."""
        try:
            kind, _ = parse_device(self.device)
        except ValueError as exc:
            raise RoseError(f"engine {exc}") from exc
        if kind == "auto":
            raise RoseError("an engine's device must be resolved first ('cpu', 'cuda' or 'cuda:N', not 'auto')")
        return kind == "cuda"

    @property
    def profile_device(self) -> str:
        """The device part of this engine's latency-profile key: "" on CPU (the profile names the host's
        CPU), else the GPUs, their sharding and whether CUDA graphs run (all of them change step times)."""
        if not self.on_gpu:
            return ""
        mode = "eager" if self.enforce_eager else "graphs"
        return f"{self.device}-tp{self.tensor_parallel_size}-{mode}"

    @property
    def device_ids(self) -> list[int] | None:
        """The CUDA devices of a ``"cuda:N"`` engine (N .. N + tensor_parallel_size - 1); ``None`` otherwise."""
        _, index = parse_device(self.device)
        if index is None:
            return None
        return list(range(index, index + self.tensor_parallel_size))

    def require_model(self) -> None:
        """``RoseError`` unless ``model_dir`` holds a model (its config.json)."""
        if not (Path(self.model_dir) / "config.json").is_file():
            raise RoseError(f"no model at {self.model_dir} (config.json missing): point the config at a model dir")

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model_dir).name

    def has_tokenizer(self) -> bool:
        root = Path(self.model_dir)
        return (root / "tokenizer.json").is_file() or (root / "tokenizer_config.json").is_file()


CPU_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def _check_cpu_binding(tp: int) -> None:
    """A sharded CPU engine needs one CPU list per rank in ``VLLM_CPU_OMP_THREADS_BIND`` (read by its workers)."""
    bind = os.environ.get(CPU_BIND, "")
    if len(bind.split("|")) != tp or not all(bind.split("|")):
        raise RoseError(
            f"a CPU engine with tensor_parallel_size = {tp} needs {CPU_BIND} to give each rank its cores, one list "
            f"per rank separated by '|' (e.g. {'|'.join(str(i) for i in range(tp))!r}); it is {bind!r}"
        )
