"""A Llama-shaped parameter set and its next version after one real Adam step, for the benchmark.

Each tensor starts as fp32 master weights (normal, std 0.02; norms 1.0) that are NOT bf16-exact (a
model mid-training). Adam (beta1 0.9, beta2 0.999, eps 1e-8) takes one warm-up step, whose bf16 cast
is version 0, then one more step, whose bf16 cast is version 1: so what changes between the versions
is the true bf16 absorption of an RL-sized update. Tensor by tensor, so memory stays at the two bf16
versions plus one tensor's fp32 state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rose_core.support.errors import ConfigError
from rose_transfer.plan.shard_inference import ModelShape, infer_shard_spec

HEAD_DIM = 64


@dataclass(slots=True, frozen=True)
class LlamaShape:
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int

    @property
    def model(self) -> ModelShape:
        return ModelShape(self.heads, self.kv_heads, HEAD_DIM)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        h, kv = self.hidden, self.kv_heads * HEAD_DIM
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab, h)}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out |= {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, h),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (self.intermediate, h),
                p + "mlp.up_proj.weight": (self.intermediate, h),
                p + "mlp.down_proj.weight": (h, self.intermediate),
            }
        out |= {"model.norm.weight": (h,), "lm_head.weight": (self.vocab, h)}
        return out

    def params(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes().values())


def llama_shape(params: int, tp: int = 8) -> LlamaShape:
    """A Llama-like shape of about ``params`` (at least), whose heads and KV heads split over ``tp``
    ranks: the narrowest hidden size (a multiple of 64 x ``tp``) at which the layer count needed stays
    at most hidden / 24 (Llama's depth-to-width)."""
    if params < 1_000_000:
        raise ConfigError(f"--params must be at least 1e6, got {params}")
    vocab = 32000 if params >= 100_000_000 else 8192
    hidden = HEAD_DIM * tp
    while True:
        heads = hidden // HEAD_DIM
        kv = max(k for k in range(tp, max(tp, heads // 4) + 1, tp) if heads % k == 0)
        one = LlamaShape(hidden, 1, _intermediate(hidden, tp), vocab, heads, kv)
        per_layer = LlamaShape(hidden, 2, one.intermediate, vocab, heads, kv).params() - one.params()
        layers = max(2, -(-(params - (one.params() - per_layer)) // per_layer))
        if layers <= max(2, hidden // 24):
            return LlamaShape(hidden, layers, one.intermediate, vocab, heads, kv)
        hidden += HEAD_DIM * tp


def _intermediate(hidden: int, tp: int) -> int:
    step = 64 * tp
    return -(-int(hidden * 8 / 3) // step) * step


def shard_specs(shape: LlamaShape) -> dict[str, str]:
    return {name: infer_shard_spec(name, dims, shape.model).to_text() for name, dims in shape.shapes().items()}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bfloat16 bits (int16), round to nearest even (as torch's cast; inputs are finite)."""
    bits = x.view(np.uint32)
    rounded = bits + (((bits >> 16) & 1) + np.uint32(0x7FFF))
    return (rounded >> 16).astype(np.uint16).view(np.int16)


def adam_versions(
    shape: LlamaShape, lr: float, seed: int = 0, progress: Callable[[int], None] | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Versions 0 and 1 (bf16 bits as int16) of every tensor: master after Adam step 1 and step 2."""
    rng = np.random.default_rng(seed)
    v0: dict[str, np.ndarray] = {}
    v1: dict[str, np.ndarray] = {}
    for name, dims in shape.shapes().items():
        if name.endswith("norm.weight"):
            master = 1.0 + 0.01 * rng.standard_normal(dims, dtype=np.float32)
        else:
            master = 0.02 * rng.standard_normal(dims, dtype=np.float32)
        m = np.zeros_like(master)
        v = np.zeros_like(master)
        for step in (1, 2):
            grad = rng.standard_normal(dims, dtype=np.float32)
            _adam_step(master, grad, m, v, step, lr)
            (v0 if step == 1 else v1)[name] = bf16_bits(master)
        if progress is not None:
            progress(master.size)
    return v0, v1


def _adam_step(
    w: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, lr: float, b1: float = 0.9, b2: float = 0.999
) -> None:
    """One Adam step in place (fp32 throughout, as torch.optim.Adam)."""
    m *= b1
    m += (1 - b1) * g
    v *= b2
    g *= g
    v += (1 - b2) * g
    denom = np.sqrt(v / np.float32(1 - b2**t))
    denom += np.float32(1e-8)
    w -= np.float32(lr / (1 - b1**t)) * m / denom
