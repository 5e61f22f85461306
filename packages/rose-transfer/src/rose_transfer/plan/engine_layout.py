"""The checkpoint -> engine tensor mapping the publisher cuts, so a rollout engine's own parameters can be
the receiver's resident weights (patched in place, no loader in between).

vLLM fuses some checkpoint tensors of Llama-, Qwen2- and Qwen3-style models into one parameter:
``q_proj``, ``k_proj``, ``v_proj`` -> ``qkv_proj`` (rows stacked in that order; GQA's smaller k and v
included, biases likewise), ``gate_proj``, ``up_proj`` -> ``gate_up_proj``; with tied embeddings it
keeps no ``lm_head.weight`` (the head is ``model.embed_tokens.weight``); it pads the vocabulary rows
of the embedding and the head with zeros to a multiple of 64 (``EngineLayout.vocab_padding``; what its
loader writes there). Every other tensor keeps its name and bytes. The mapping is pure: the same checkpoint always gives the same engine tensors, in a
deterministic order (the flat stream's layout depends on it).

How each engine tensor splits over tensor-parallel ranks (``engine_shards``) is vLLM's: ``qkv_proj`` by heads
(q, then k and v, KV heads replicated when fewer than ranks), ``gate_up_proj`` as gate then up, ``o_proj`` and
``down_proj`` by input columns, the embedding and the head by padded vocabulary rows, everything else whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rose_core.protocol.engine_layout import EngineLayout
from rose_core.support.errors import RoseError
from rose_transfer.plan.shard_inference import ModelShape, infer_shard_spec

FUSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("gate_up_proj", ("gate_proj", "up_proj")),
)
"""(engine module, checkpoint modules stacked into it along dim 0, in order)."""
TIED_HEAD = "lm_head.weight"
VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")
KNOWN_ENGINES = ("checkpoint", "vllm")


def to_engine_layout(tensors: Mapping[str, Any], layout: EngineLayout) -> dict[str, Any]:
    """``tensors`` (checkpoint names) as ``layout.engine`` holds them; numpy arrays or torch tensors."""
    if layout.engine not in KNOWN_ENGINES:
        raise RoseError(f"unknown engine layout {layout.engine!r}: choose one of {list(KNOWN_ENGINES)}")
    if layout.engine == "checkpoint":
        return dict(tensors)
    out: dict[str, Any] = {}
    pending: dict[str, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        if layout.tie_word_embeddings and name == TIED_HEAD:
            continue
        fused = _fused_name(name)
        if fused is None:
            out[name] = _padded(tensor, layout.vocab_padding) if name in VOCAB_TENSORS else tensor
            continue
        engine_name, part, order = fused
        parts = pending.setdefault(engine_name, {})
        if part in parts:
            raise RoseError(f"{name}: given twice; publish each tensor once")
        parts[part] = tensor
        out.setdefault(engine_name, None)  # keep the position of the first part
        if len(parts) == len(order):
            out[engine_name] = _stack(engine_name, [parts[p] for p in order])
            del pending[engine_name]
    if pending:
        name, parts = next(iter(pending.items()))
        order = _fused_name_parts(name)
        missing = [p for p in order if p not in parts]
        raise RoseError(f"{name}: the checkpoint has {sorted(parts)} but not {missing}; publish every part")
    return out


def engine_shards(shapes: Mapping[str, Sequence[int]], layout: EngineLayout, *, strict: bool = False) -> dict[str, str]:
    """The shard spec text of every engine tensor (``to_engine_layout``'s names -> shapes), for a publisher to
    annotate a version with, so a rank of a tensor-parallel engine can pull only its shard. None are known
    (``{}``: versions are whole-only) when the layout lacks the attention shape or a tensor's split is unknown;
    ``strict``: ``RoseError`` naming what is missing instead."""
    if layout.engine != "vllm" or not layout.knows_heads:
        if strict:
            raise RoseError("the model's attention shape (num_attention_heads, num_key_value_heads, head_dim) is "
                            "unknown, so its tensors cannot be split over tensor-parallel ranks: add it to config.json")
        return {}
    model = ModelShape(layout.num_heads, layout.num_kv_heads, layout.head_dim, layout.vocab_padding)
    try:
        return {name: infer_shard_spec(name, shape, model).to_text() for name, shape in shapes.items()}
    except RoseError:
        if strict:
            raise
        return {}


def _fused_name(name: str) -> tuple[str, str, tuple[str, ...]] | None:
    """``(engine name, part, parts in order)`` for a checkpoint tensor the engine fuses, else None."""
    for engine_module, parts in FUSIONS:
        for part in parts:
            marker = f".{part}."
            if marker in name:
                return name.replace(marker, f".{engine_module}."), part, parts
    return None


def _fused_name_parts(engine_name: str) -> tuple[str, ...]:
    return next(parts for module, parts in FUSIONS if f".{module}." in engine_name)


def _stack(name: str, parts: Sequence[Any]) -> Any:
    rows = {tuple(p.shape[1:]) for p in parts}
    dtypes = {str(p.dtype) for p in parts}
    if len(rows) != 1 or len(dtypes) != 1:
        raise RoseError(f"{name}: its parts do not stack (shapes {[tuple(p.shape) for p in parts]}, dtypes {dtypes})")
    return _concat(parts)


def _padded(tensor: Any, multiple: int) -> Any:
    rows = int(tensor.shape[0])
    extra = -rows % multiple if multiple > 1 else 0
    if not extra:
        return tensor
    return _concat([tensor, _zeros_like_rows(tensor, extra)])


def _zeros_like_rows(tensor: Any, rows: int) -> Any:
    shape = (rows, *tensor.shape[1:])
    if hasattr(tensor, "new_zeros"):
        return tensor.new_zeros(shape)
    import numpy as np

    return np.zeros(shape, dtype=tensor.dtype)


def _concat(parts: Sequence[Any]) -> Any:
    cat: Callable[[Sequence[Any]], Any]
    if hasattr(parts[0], "detach"):
        from rose_transfer.version.torch_tensors import cat_rows as cat
    else:
        import numpy as np

        def cat(arrays: Sequence[Any]) -> Any:
            return np.concatenate(arrays, axis=0)

    return cat(parts)
