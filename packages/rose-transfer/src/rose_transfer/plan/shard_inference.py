"""The shard spec of a parameter from its name and shape (Llama / Qwen families, HF and vLLM names),
with explicit overrides first. Unknown multi-dimensional parameters are an error that names the fix,
never a silent guess."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rose_core.support.errors import RoseError
from rose_transfer.plan.shard_spec import Section, ShardSpec


@dataclass(slots=True, frozen=True)
class ModelShape:
    """What fused layouts need: attention heads, KV heads (GQA) and the head size."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_padding: int = 64

    def __post_init__(self) -> None:
        if min(self.num_heads, self.num_kv_heads, self.head_dim, self.vocab_padding) < 1:
            raise RoseError("model heads, KV heads, head size and vocab padding must all be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise RoseError(f"{self.num_heads} heads cannot share {self.num_kv_heads} KV heads: fix the model shape")


_VOCAB = re.compile(r"(?:^|\.)(?:embed_tokens|lm_head|wte|word_embeddings|output_layer)\.weight$")
_QKV_SPLIT = re.compile(r"\.(q_proj|k_proj|v_proj)\.(?:weight|bias)$")
_QKV_FUSED = re.compile(r"\.qkv_proj\.(?:weight|bias)$")
_COLUMN = re.compile(r"\.(?:gate_proj|up_proj)\.(?:weight|bias)$")
_GATE_UP = re.compile(r"\.gate_up_proj\.(?:weight|bias)$")
_ROW = re.compile(r"\.(?:o_proj|down_proj)\.weight$")
_REPLICATED = re.compile(r"(?:norm|\.(?:o_proj|down_proj)\.bias$|rotary_emb|inv_freq)")


def infer_shard_spec(
    name: str,
    shape: Sequence[int],
    model: ModelShape | None = None,
    overrides: Mapping[str, ShardSpec | str] | None = None,
) -> ShardSpec:
    """The spec of ``name``: the first override whose glob pattern matches, else the name rules."""
    for pattern, override in (overrides or {}).items():
        if fnmatch.fnmatchcase(name, pattern):
            return override if isinstance(override, ShardSpec) else ShardSpec.parse(override)
    spec = _by_name(name, tuple(shape), model)
    if spec is None:
        if len(shape) <= 1:
            return ShardSpec("replicated")
        raise RoseError(
            f"cannot infer how {name} {list(shape)} is sharded: add an override such as "
            f'{{"{name}": "column"}} (kinds: replicated, column, row, vocab, qkv, gate_up)'
        )
    return spec


def _by_name(name: str, shape: tuple[int, ...], model: ModelShape | None) -> ShardSpec | None:
    if _VOCAB.search(name):
        return ShardSpec("vocab", padding=model.vocab_padding if model else 64)
    if _REPLICATED.search(name):
        return ShardSpec("replicated")
    if _ROW.search(name):
        return ShardSpec("row")
    if _COLUMN.search(name):
        return ShardSpec("column")
    if _GATE_UP.search(name):
        if shape[0] % 2:
            raise RoseError(f"{name} {list(shape)} cannot be a fused gate/up: its first dimension is odd")
        return ShardSpec("gate_up", sections=(Section(shape[0] // 2), Section(shape[0] // 2)))
    split = _QKV_SPLIT.search(name)
    if split:
        unit = model.head_dim if model else 1
        return ShardSpec("column", sections=(Section(shape[0], unit),))
    if _QKV_FUSED.search(name):
        return _fused_qkv(name, shape, model)
    return None


def _fused_qkv(name: str, shape: tuple[int, ...], model: ModelShape | None) -> ShardSpec:
    if model is None:
        raise RoseError(f"cannot split the fused {name}: pass the model's heads (ModelShape) or an override")
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    if shape[0] != q + 2 * kv:
        raise RoseError(
            f"{name} has {shape[0]} rows, {model.num_heads} heads and {model.num_kv_heads} KV heads of "
            f"{model.head_dim} need {q + 2 * kv}: fix the model shape"
        )
    sections = (Section(q, model.head_dim), Section(kv, model.head_dim), Section(kv, model.head_dim))
    return ShardSpec("qkv", sections=sections)
