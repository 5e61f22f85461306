"""How to build one engine: model, purpose and the vLLM sizes the executor sets (no vllm types)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rose_core.errors import RoseError

Purpose = Literal["serving", "rollout"]


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """How to build one engine; sizes validated on construction, the model directory when an engine starts
    (``require_model``), so a twin can carry a spec without a model on disk.

    On CPU, ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB), when set, overrides ``kv_cache_gib`` (vLLM's platform code).
    """

    model_dir: Path
    purpose: Purpose = "rollout"
    kv_cache_gib: float = 1.0
    max_num_seqs: int = 16
    max_model_len: int = 1024
    enable_prefix_caching: bool = True
    dtype: str = "bfloat16"
    served_model_name: str = ""
    prefill_chunk_tokens: int = 0
    """Chunked prefill: at most this many tokens per engine step (vLLM's ``max_num_batched_tokens``, raised
    to ``max_num_seqs`` if lower); 0: vLLM's default. The rollout engine runs the guard's admission unit."""

    def __post_init__(self) -> None:
        if self.purpose not in ("serving", "rollout"):
            raise RoseError(f"engine purpose must be 'serving' or 'rollout', not {self.purpose!r}")
        if self.kv_cache_gib <= 0 or self.max_num_seqs < 1 or self.max_model_len < 1:
            raise RoseError("kv_cache_gib, max_num_seqs and max_model_len must be positive")
        if self.prefill_chunk_tokens < 0:
            raise RoseError("prefill_chunk_tokens must be >= 0 (0: the engine's default)")

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
