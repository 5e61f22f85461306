"""How the receiving engines hold a weight version: the part of the trainer -> publisher contract that names the
engine's layout. What a layout means (which tensors fuse, how vocabularies pad, how each tensor splits over
tensor-parallel ranks) is rose-transfer's (``rose_transfer.plan.engine_layout``); the trainer only says which one
its engines use, and the attention shape a fused QKV splits by."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class EngineLayout:
    """The tensor names and fusions the receiving engines hold, so a publisher can cut versions that land
    in the engines' own parameters (``rose_transfer.plan.engine_layout``). ``engine``: ``"vllm"`` (fused
    ``qkv_proj`` / ``gate_up_proj``) or ``"checkpoint"`` (the names as given)."""

    engine: str = "vllm"
    tie_word_embeddings: bool = False
    vocab_padding: int = 64
    """Rows of the embedding and the head, zero-padded to a multiple of this (vLLM pads to 64)."""
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    """The attention shape (0: unknown). Known, every version is annotated with how each tensor splits over
    tensor-parallel ranks, so a rank of a sharded engine pulls only its shard; unknown, versions are whole-only."""

    @property
    def knows_heads(self) -> bool:
        return min(self.num_heads, self.num_kv_heads, self.head_dim) > 0


def engine_layout_of(config: Mapping[str, Any], engine: str = "vllm") -> EngineLayout:
    """The layout a vLLM engine gives the model of a Hugging Face ``config`` (config.json as a dict)."""
    heads = int(config.get("num_attention_heads") or 0)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or (int(config.get("hidden_size") or 0) // heads if heads else 0))
    return EngineLayout(engine=engine, tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
