"""How the receiving engines hold a weight version: the part of the trainer -> publisher contract that names the
engine's layout. What a layout means (which tensors fuse, how vocabularies pad) is rose-transfer's
(``rose_transfer.plan.engine_layout``); the trainer only says which one its engines use."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineLayout:
    """The tensor names and fusions the receiving engines hold, so a publisher can cut versions that land
    in the engines' own parameters (``rose_transfer.plan.engine_layout``). ``engine``: ``"vllm"`` (fused
    ``qkv_proj`` / ``gate_up_proj``) or ``"checkpoint"`` (the names as given)."""

    engine: str = "vllm"
    tie_word_embeddings: bool = False
    vocab_padding: int = 64
    """Rows of the embedding and the head, zero-padded to a multiple of this (vLLM pads to 64)."""
