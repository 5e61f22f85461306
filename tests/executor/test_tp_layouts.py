"""Each tensor-parallel layer type, as a rank of a sharded rollout engine pulls it from a version, is exactly what
vLLM's own ``weight_loader`` puts in that rank's parameter: ``QKVParallelLinear`` (q, k, v by heads; KV heads
replicated when fewer than ranks), ``MergedColumnParallelLinear`` (gate then up), ``RowParallelLinear`` (by input
columns), ``VocabParallelEmbedding`` and ``ParallelLMHead`` (padded vocabulary rows, zeros past the real ones).
The layers are vLLM's, built as rank r of t (its group-size and rank functions answer t and r); the views are
rose-transfer's, cut from one published version with the shard specs the publisher annotates it with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch

from rose_core.protocol.engine_layout import EngineLayout
from rose_core.protocol.messages import ShardView
from rose_transfer.plan.engine_layout import engine_shards, to_engine_layout
from rose_transfer.plan.shard_view import view_version
from rose_transfer.version.manifest import flatten, tensor_views

HIDDEN, INTER, VOCAB, HEAD_DIM = 128, 256, 160, 32
P = "model.layers.0."


@contextlib.contextmanager
def as_rank(tp: int, rank: int) -> Iterator[None]:
    """vLLM's layers built and loaded as ``rank`` of ``tp`` (no process group needed)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor import parameter
    from vllm.model_executor.layers import linear, vocab_parallel_embedding

    with contextlib.ExitStack() as stack:
        for module in (linear, vocab_parallel_embedding, parameter):
            for name, value in (("get_tensor_model_parallel_world_size", tp), ("get_tensor_model_parallel_rank", rank)):
                if hasattr(module, name):
                    stack.enter_context(mock.patch.object(module, name, lambda v=value: v))
        stack.enter_context(set_current_vllm_config(VllmConfig()))
        yield


def checkpoint(heads: int, kv_heads: int, bias: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    q, kv = heads * HEAD_DIM, kv_heads * HEAD_DIM
    out = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN), "lm_head.weight": rand(VOCAB, HIDDEN),
           P + "self_attn.q_proj.weight": rand(q, HIDDEN), P + "self_attn.k_proj.weight": rand(kv, HIDDEN),
           P + "self_attn.v_proj.weight": rand(kv, HIDDEN), P + "self_attn.o_proj.weight": rand(HIDDEN, q),
           P + "mlp.gate_proj.weight": rand(INTER, HIDDEN), P + "mlp.up_proj.weight": rand(INTER, HIDDEN),
           P + "mlp.down_proj.weight": rand(HIDDEN, INTER), P + "input_layernorm.weight": rand(HIDDEN)}
    if bias:  # Qwen2's
        out |= {P + f"self_attn.{x}_proj.bias": rand(n) for x, n in (("q", q), ("k", kv), ("v", kv))}
    return out


def vllm_layers(ckpt: dict[str, torch.Tensor], heads: int, kv_heads: int, bias: bool) -> dict[str, torch.Tensor]:
    """The engine-layout tensors of this rank as vLLM's layers load them from the checkpoint."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    bf16: dict[str, Any] = {"params_dtype": torch.bfloat16}
    qkv = QKVParallelLinear(HIDDEN, HEAD_DIM, heads, kv_heads, bias=bias, **bf16)
    for part in ("q", "k", "v"):
        qkv.weight_loader(qkv.weight, ckpt[P + f"self_attn.{part}_proj.weight"], part)
        if bias:
            qkv.weight_loader(qkv.bias, ckpt[P + f"self_attn.{part}_proj.bias"], part)
    gate_up = MergedColumnParallelLinear(HIDDEN, [INTER, INTER], bias=False, **bf16)
    for index, part in enumerate(("gate", "up")):
        gate_up.weight_loader(gate_up.weight, ckpt[P + f"mlp.{part}_proj.weight"], index)
    rows = {name: RowParallelLinear(ckpt[P + name].shape[1], HIDDEN, bias=False, **bf16)
            for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight")}
    for name, layer in rows.items():
        layer.weight_loader(layer.weight, ckpt[P + name])
    vocab = {"model.embed_tokens.weight": VocabParallelEmbedding(VOCAB, HIDDEN, **bf16),
             "lm_head.weight": ParallelLMHead(VOCAB, HIDDEN, **bf16)}
    for name, layer in vocab.items():
        layer.weight_loader(layer.weight, ckpt[name])
    loaded = {P + "self_attn.qkv_proj.weight": qkv.weight, P + "mlp.gate_up_proj.weight": gate_up.weight,
              **{P + name: layer.weight for name, layer in rows.items()}, **{n: la.weight for n, la in vocab.items()},
              P + "input_layernorm.weight": ckpt[P + "input_layernorm.weight"]}
    if bias:
        loaded[P + "self_attn.qkv_proj.bias"] = qkv.bias
    return loaded


@pytest.mark.parametrize(("tp", "heads", "kv_heads", "bias"), [
    (2, 4, 2, False),  # Llama-style GQA, one KV head per rank
    (2, 4, 2, True),  # Qwen2-style: biases on q, k, v
    (4, 4, 2, False),  # fewer KV heads than ranks: each KV head on two ranks
    (2, 4, 4, False),  # multi-head attention
])
def test_each_ranks_view_is_what_vllms_weight_loader_loads(tp: int, heads: int, kv_heads: int, bias: bool) -> None:
    ckpt = checkpoint(heads, kv_heads, bias)
    layout = EngineLayout(num_heads=heads, num_kv_heads=kv_heads, head_dim=HEAD_DIM)
    engine = to_engine_layout(ckpt, layout)
    shards = engine_shards({name: tuple(t.shape) for name, t in engine.items()}, layout, strict=True)
    assert {shards[P + "self_attn.qkv_proj.weight"].split(";")[0], shards[P + "mlp.gate_up_proj.weight"].split(";")[0],
            shards[P + "mlp.down_proj.weight"], shards["lm_head.weight"].split(";")[0]} == {"qkv", "gate_up", "row",
                                                                                         "vocab"}
    whole = flatten(engine, version=1, shards=shards)
    for rank in range(tp):
        view = view_version(whole, ShardView(tp=tp, rank=rank))
        pulled = tensor_views(view.stream, view.manifest.tensors)
        with as_rank(tp, rank):
            loaded = vllm_layers(ckpt, heads, kv_heads, bias)
        assert set(loaded) == set(pulled)
        for name, tensor in loaded.items():
            expected = tensor.detach().contiguous().view(torch.int16).numpy()
            assert pulled[name].shape == expected.shape, (name, rank)
            assert np.array_equal(pulled[name], expected), (name, rank)
