"""The checkpoint -> vLLM tensor mapping the publisher cuts, and where a patch writes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rose_core.protocol.engine_layout import EngineLayout
from rose_core.support.errors import RoseError
from rose_transfer.codec.patch_encoder import build_patch
from rose_transfer.codec.patch_positions import changed_offsets
from rose_transfer.plan.engine_layout import engine_shards, to_engine_layout

VLLM = EngineLayout(tie_word_embeddings=False)


def llama_layer(hidden: int = 8, kv: int = 4, inter: int = 12, *, bias: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    p = "model.layers.0."
    out = {
        "model.embed_tokens.weight": t(10, hidden),
        p + "self_attn.q_proj.weight": t(hidden, hidden),
        p + "self_attn.k_proj.weight": t(kv, hidden),
        p + "self_attn.v_proj.weight": t(kv, hidden),
        p + "self_attn.o_proj.weight": t(hidden, hidden),
        p + "mlp.gate_proj.weight": t(inter, hidden),
        p + "mlp.up_proj.weight": t(inter, hidden),
        p + "mlp.down_proj.weight": t(hidden, inter),
        p + "input_layernorm.weight": t(hidden),
        "model.norm.weight": t(hidden),
        "lm_head.weight": t(10, hidden),
    }
    if bias:
        out |= {p + f"self_attn.{n}_proj.bias": t(hidden if n == "q" else kv) for n in "qkv"}
    return out


def test_q_k_v_and_gate_up_are_stacked_in_vllms_order_and_names() -> None:
    ckpt = llama_layer(bias=True)
    engine = to_engine_layout(ckpt, VLLM)
    p = "model.layers.0."
    qkv = engine[p + "self_attn.qkv_proj.weight"]
    assert qkv.shape == (16, 8)  # GQA: 8 query rows, then 4 key and 4 value rows
    assert torch.equal(qkv, torch.cat([ckpt[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
    assert torch.equal(engine[p + "self_attn.qkv_proj.bias"],
                       torch.cat([ckpt[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]))
    gate_up = engine[p + "mlp.gate_up_proj.weight"]
    assert torch.equal(gate_up, torch.cat([ckpt[p + "mlp.gate_proj.weight"], ckpt[p + "mlp.up_proj.weight"]]))
    assert not any(f".{n}_proj." in name for name in engine for n in ("q", "k", "v", "gate", "up"))
    assert torch.equal(engine[p + "mlp.down_proj.weight"], ckpt[p + "mlp.down_proj.weight"])
    assert list(engine)[:2] == ["model.embed_tokens.weight", p + "self_attn.qkv_proj.weight"]  # stable order


def test_the_vocabulary_rows_are_zero_padded_to_vllms_multiple() -> None:
    ckpt = llama_layer()
    engine = to_engine_layout(ckpt, VLLM)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert engine[name].shape == (64, 8)
        assert torch.equal(engine[name][:10], ckpt[name]) and not engine[name][10:].any()
    unpadded = to_engine_layout(ckpt, EngineLayout(vocab_padding=1))
    assert unpadded["model.embed_tokens.weight"].shape == (10, 8)


def test_tied_embeddings_keep_no_head_and_numpy_works_too() -> None:
    ckpt = {k: v.view(torch.int16).numpy() for k, v in llama_layer().items()}
    engine = to_engine_layout(ckpt, EngineLayout(tie_word_embeddings=True))
    assert "lm_head.weight" not in engine
    assert isinstance(engine["model.layers.0.self_attn.qkv_proj.weight"], np.ndarray)
    assert to_engine_layout(ckpt, EngineLayout(engine="checkpoint")) == ckpt


def test_a_missing_part_or_an_unknown_engine_is_named() -> None:
    ckpt = llama_layer()
    del ckpt["model.layers.0.self_attn.v_proj.weight"]
    with pytest.raises(RoseError, match=r"qkv_proj.weight: .* not \['v_proj'\]"):
        to_engine_layout(ckpt, VLLM)
    with pytest.raises(RoseError, match="unknown engine layout 'sglang'"):
        to_engine_layout(llama_layer(), EngineLayout(engine="sglang"))


def test_parts_that_do_not_stack_are_refused() -> None:
    ckpt = llama_layer()
    ckpt["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(4, 5, dtype=torch.bfloat16)
    with pytest.raises(RoseError, match="do not stack"):
        to_engine_layout(ckpt, VLLM)


def test_changed_offsets_are_exactly_the_words_a_patch_writes() -> None:
    base = np.arange(1000, dtype=np.uint16).view(np.uint8)
    new = base.copy()
    words = new.view(np.uint16)
    words[[3, 400, 999]] += 1
    payload = build_patch(base, new, 2)
    assert payload is not None
    assert changed_offsets(payload, base.nbytes).tolist() == [6, 800, 1998]


def test_a_version_published_in_the_engines_layout_says_how_each_tensor_splits_when_the_heads_are_known() -> None:
    """The publisher annotates every engine tensor with its shard spec (so a tensor-parallel rank can pull its
    shard); without the attention shape the version is whole-only, and an engine that needs it says so."""
    import asyncio

    from rose_transfer import SparsePublisher
    from rose_transfer.fetch.fetcher import WeightFetcher
    from rose_transfer.resident.resident_weights import ResidentWeights

    secret = b"engine-layout-test-secret-0123456789"
    ckpt, p = llama_layer(hidden=8, kv=4), "model.layers.0."
    heads = EngineLayout(tie_word_embeddings=False, num_heads=4, num_kv_heads=2, head_dim=2)
    shards = {}
    with SparsePublisher(secret=secret, host="127.0.0.1", port=0) as publisher:
        for version, layout in ((1, heads), (2, VLLM)):
            target = ResidentWeights()
            asyncio.run(WeightFetcher(secret, "r").fetch_into(publisher.publish(version, version, ckpt, layout=layout),
                                                              target))
            assert target.manifest is not None
            shards[version] = {e.name: e.shard for e in target.manifest.tensors}
    assert shards[1][p + "self_attn.qkv_proj.weight"] == "qkv;sections=8@2,4@2,4@2"
    assert shards[1][p + "mlp.gate_up_proj.weight"] == "gate_up;sections=12,12"
    assert (shards[1][p + "mlp.down_proj.weight"], shards[1]["lm_head.weight"]) == ("row", "vocab;pad=64")
    assert shards[1]["model.norm.weight"] == "replicated"
    assert set(shards[2].values()) == {"replicated"}
    shapes = {name: tuple(t.shape) for name, t in to_engine_layout(ckpt, VLLM).items()}
    with pytest.raises(RoseError, match=r"attention shape .* is unknown"):
        engine_shards(shapes, VLLM, strict=True)
