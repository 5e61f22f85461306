"""Shard specs, their inference, pipeline stages, and copy plans: every receiver of any tensor-parallel
degree ends with exactly its slice, whatever degree the source was sharded with."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_core.support.errors import RoseError
from rose_transfer.bench.pipeline_layout import PipelineLayout
from rose_transfer.plan.shard_inference import ModelShape, infer_shard_spec
from rose_transfer.plan.shard_plan import assemble, needed_buckets, plan_tensor, receiver_segments
from rose_transfer.plan.shard_spec import Section, ShardSpec, local_shape
from rose_transfer.version.manifest import flatten

DEGREES = [1, 2, 4, 8]


# ---------------------------------------------------------------- a reference written without the planner


def _heads(block: np.ndarray, heads: int, ranks: int, rank: int) -> np.ndarray:
    per_head = np.split(block, heads, axis=0)
    if heads >= ranks:
        return np.concatenate(per_head[rank * heads // ranks : (rank + 1) * heads // ranks])
    return per_head[rank * heads // ranks]


def _reference(full: np.ndarray, case: dict, ranks: int, rank: int) -> np.ndarray:
    kind = case["kind"]
    if kind == "replicated":
        return full
    if kind == "column":
        return np.split(full, ranks, axis=0)[rank]
    if kind == "row":
        return np.split(full, ranks, axis=1)[rank]
    if kind == "heads":
        return _heads(full, case["heads"], ranks, rank)
    if kind == "vocab":
        vocab, pad = full.shape[0], case["pad"]
        per = -(-(-(-vocab // pad) * pad) // ranks)
        return full[min(vocab, rank * per) : min(vocab, (rank + 1) * per)]
    if kind == "qkv":
        q, kv = case["heads"] * case["head_dim"], case["kv_heads"] * case["head_dim"]
        parts = np.split(full, [q, q + kv], axis=0)
        counts = [case["heads"], case["kv_heads"], case["kv_heads"]]
        return np.concatenate([_heads(p, c, ranks, rank) for p, c in zip(parts, counts, strict=True)])
    gate, up = np.split(full, 2, axis=0)
    return np.concatenate([np.split(gate, ranks)[rank], np.split(up, ranks)[rank]])


def _spec(case: dict) -> ShardSpec:
    kind = case["kind"]
    if kind == "heads":
        return ShardSpec("column", sections=(Section(case["heads"] * case["head_dim"], case["head_dim"]),))
    if kind == "vocab":
        return ShardSpec("vocab", padding=case["pad"])
    if kind == "qkv":
        hd = case["head_dim"]
        return ShardSpec(
            "qkv",
            sections=(
                Section(case["heads"] * hd, hd),
                Section(case["kv_heads"] * hd, hd),
                Section(case["kv_heads"] * hd, hd),
            ),
        )
    if kind == "gate_up":
        return ShardSpec("gate_up", sections=(Section(case["rows"] // 2), Section(case["rows"] // 2)))
    return ShardSpec(kind)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[dict, tuple[int, ...]]:
    kind = draw(st.sampled_from(["replicated", "column", "row", "heads", "vocab", "qkv", "gate_up"]))
    cols = draw(st.integers(1, 3))
    trailing = tuple(draw(st.lists(st.integers(1, 3), max_size=1)))
    case: dict = {"kind": kind}
    if kind == "replicated":
        return case, tuple(draw(st.lists(st.integers(1, 4), max_size=3)))
    if kind == "row":
        return case, (draw(st.integers(1, 3)), 8 * draw(st.integers(1, 3)), *trailing)
    if kind in ("heads", "qkv"):
        case["heads"] = draw(st.sampled_from([8, 16]))
        case["kv_heads"] = draw(st.sampled_from([k for k in (1, 2, 4, 8) if case["heads"] % k == 0]))
        case["head_dim"] = draw(st.integers(1, 3))
        if kind == "heads":  # a k_proj / v_proj with few KV heads: replicated heads when ranks > heads
            case["heads"] = case["kv_heads"]
            return case, (case["heads"] * case["head_dim"], cols, *trailing)
        rows = (case["heads"] + 2 * case["kv_heads"]) * case["head_dim"]
        return case, (rows, cols)
    if kind == "vocab":
        case["pad"] = draw(st.sampled_from([1, 4, 64]))
        return case, (draw(st.integers(1, 70)), cols)
    rows = 8 * draw(st.integers(1, 3)) * (2 if kind == "gate_up" else 1)
    case["rows"] = rows
    return case, (rows, cols, *trailing)


@settings(max_examples=300, deadline=None)
@given(
    case_shape=_cases(),
    source_ranks=st.sampled_from(DEGREES),
    dest_ranks=st.sampled_from(DEGREES),
    dtype=st.sampled_from([np.uint8, np.uint16, np.uint32, np.uint64]),
)
def test_every_receiver_ends_with_exactly_its_slice(
    case_shape: tuple[dict, tuple[int, ...]], source_ranks: int, dest_ranks: int, dtype: type[np.unsignedinteger]
) -> None:
    case, shape = case_shape
    full = np.arange(math.prod(shape), dtype=dtype).reshape(shape) + 1
    spec = _spec(case)
    assert ShardSpec.parse(spec.to_text()) == spec
    sources = [_reference(full, case, source_ranks, q).copy() for q in range(source_ranks)]
    for q, shard in enumerate(sources):
        assert local_shape(spec, shape, source_ranks, q) == shard.shape
    for rank in range(dest_ranks):
        want = _reference(full, case, dest_ranks, rank)
        segments = plan_tensor(spec, shape, full.itemsize, source_ranks, dest_ranks, rank)
        coverage = np.zeros(want.nbytes, dtype=np.int64)
        for segment in segments:
            for i in range(segment.count):
                start = segment.dest_offset + i * segment.dest_stride
                coverage[start : start + segment.nbytes] += 1
        assert (coverage == 1).all()  # every byte of the slice once, nothing else
        got = assemble(segments, [s.reshape(-1).view(np.uint8) for s in sources], np.zeros(want.nbytes, dtype=np.uint8))
        assert got.tobytes() == want.tobytes()


def test_receivers_of_a_flat_stream_get_their_slices_and_only_their_buckets() -> None:
    model = ModelShape(num_heads=8, num_kv_heads=2, head_dim=4)
    rng = np.random.default_rng(0)
    hidden, inter, vocab = 32, 64, 50
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, hidden), dtype=np.float32),
        "model.layers.0.input_layernorm.weight": rng.standard_normal(hidden, dtype=np.float32),
        "model.layers.0.self_attn.qkv_proj.weight": rng.standard_normal((48, hidden), dtype=np.float32),
        "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((hidden, hidden), dtype=np.float32),
        "model.layers.0.mlp.gate_up_proj.weight": rng.standard_normal((2 * inter, hidden), dtype=np.float32),
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((hidden, inter), dtype=np.float32),
        "lm_head.weight": rng.standard_normal((vocab, hidden), dtype=np.float32),
    }
    specs = {name: infer_shard_spec(name, t.shape, model) for name, t in tensors.items()}
    flat = flatten(tensors, version=1, bucket_bytes=1024, shards={n: s.to_text() for n, s in specs.items()})
    for rank in range(4):
        plans = receiver_segments(flat.manifest.tensors, 4, rank)
        for entry in flat.manifest.tensors:
            spec = specs[entry.name]
            size = math.prod(local_shape(spec, entry.shape, 4, rank)) * 4
            got = assemble(plans[entry.name], [flat.stream], np.zeros(size, dtype=np.uint8))
            want = plan_tensor(spec, entry.shape, 4, 1, 4, rank)
            expected = assemble(want, [tensors[entry.name].view(np.uint8).reshape(-1)], np.zeros(size, np.uint8))
            assert got.tobytes() == expected.tobytes(), entry.name
        buckets = needed_buckets(flat.manifest, plans)
        assert 0 < len(buckets) < len(flat.manifest.buckets)
        needed = np.zeros(flat.manifest.total_bytes, dtype=bool)
        for plan in plans.values():
            for segment in plan:
                for start, length in zip(*segment.source_ranges(), strict=True):
                    needed[start : start + length] = True
        for bucket in flat.manifest.buckets:
            holds = needed[bucket.offset : bucket.offset + bucket.nbytes].any()
            assert holds == (bucket.index in buckets)


# ---------------------------------------------------------------- inference from names and shapes


@pytest.mark.parametrize(
    ("name", "shape", "text"),
    [
        ("model.embed_tokens.weight", (151936, 64), "vocab;pad=64"),
        ("lm_head.weight", (151936, 64), "vocab;pad=64"),
        ("model.layers.3.self_attn.q_proj.weight", (64, 64), "column;sections=64@8"),
        ("model.layers.3.self_attn.k_proj.weight", (16, 64), "column;sections=16@8"),
        ("model.layers.3.self_attn.v_proj.bias", (16,), "column;sections=16@8"),
        ("model.layers.3.self_attn.qkv_proj.weight", (96, 64), "qkv;sections=64@8,16@8,16@8"),
        ("model.layers.3.self_attn.o_proj.weight", (64, 64), "row"),
        ("model.layers.3.self_attn.q_norm.weight", (8,), "replicated"),
        ("model.layers.3.mlp.gate_proj.weight", (128, 64), "column"),
        ("model.layers.3.mlp.up_proj.weight", (128, 64), "column"),
        ("model.layers.3.mlp.gate_up_proj.weight", (256, 64), "gate_up;sections=128,128"),
        ("model.layers.3.mlp.down_proj.weight", (64, 128), "row"),
        ("model.layers.3.post_attention_layernorm.weight", (64,), "replicated"),
        ("model.norm.weight", (64,), "replicated"),
        ("model.some_scale", (4,), "replicated"),
    ],
)
def test_llama_and_qwen_names(name: str, shape: tuple[int, ...], text: str) -> None:
    model = ModelShape(num_heads=8, num_kv_heads=2, head_dim=8)
    assert infer_shard_spec(name, shape, model).to_text() == text


def test_overrides_win_and_unknown_matrices_name_the_fix() -> None:
    overrides = {"*.experts.*": "replicated", "model.layers.*.mlp.router.weight": ShardSpec("row")}
    assert infer_shard_spec("model.layers.1.mlp.experts.3.w1", (8, 8), overrides=overrides).kind == "replicated"
    assert infer_shard_spec("model.layers.1.mlp.router.weight", (8, 8), overrides=overrides).kind == "row"
    with pytest.raises(RoseError, match=r"cannot infer how model.mystery.weight \[8, 8\] is sharded: add an override"):
        infer_shard_spec("model.mystery.weight", (8, 8))
    with pytest.raises(RoseError, match="pass the model's heads"):
        infer_shard_spec("model.layers.0.self_attn.qkv_proj.weight", (96, 64))
    with pytest.raises(RoseError, match="need 96"):
        infer_shard_spec("model.layers.0.self_attn.qkv_proj.weight", (90, 64), ModelShape(8, 2, 8))


def test_indivisible_splits_are_clear_errors() -> None:
    with pytest.raises(RoseError, match=r"cannot split 6 units .* over 4 ranks"):
        plan_tensor(ShardSpec("column"), (6, 2), 4, 1, 4, 0, "w")
    with pytest.raises(RoseError, match="sum to 10"):
        plan_tensor(ShardSpec("gate_up", sections=(Section(5), Section(5))), (12, 2), 4, 1, 2, 0, "w")
    with pytest.raises(RoseError, match="unknown shard kind"):
        ShardSpec.parse("diagonal")
    with pytest.raises(RoseError, match="options are"):
        ShardSpec.parse("column;stride=2")


# ---------------------------------------------------------------- pipeline stages


def test_pipeline_stages_of_llama_names() -> None:
    layout = PipelineLayout(num_layers=10, stages=4)
    assert [len(r) for r in layout.stage_ranges()] == [3, 3, 2, 2]
    assert layout.stage_of("model.embed_tokens.weight") == 0
    assert layout.stage_of("model.layers.0.mlp.down_proj.weight") == 0
    assert layout.stage_of("model.layers.5.self_attn.o_proj.weight") == 1
    assert layout.stage_of("model.layers.9.input_layernorm.weight") == 3
    assert layout.stage_of("model.norm.weight") == 3
    assert layout.stage_of("lm_head.weight") == 3
    custom = PipelineLayout(num_layers=10, stages=2, layers_per_stage=(4, 6))
    assert custom.stage_of("model.layers.4.mlp.up_proj.weight") == 1
    with pytest.raises(RoseError, match="summing to 10"):
        PipelineLayout(num_layers=10, stages=2, layers_per_stage=(4, 5))
    with pytest.raises(RoseError, match="has 10 layers"):
        layout.stage_of("model.layers.12.mlp.up_proj.weight")
