"""``assembly_plan``: the local shards of every rank of a group fill exactly the stream ``flatten`` makes
of the full tensors (GQA heads replicated over ranks, an uneven vocab split, fused sections)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from rose_core.protocol.messages import ShardView
from rose_core.support.errors import RoseError
from rose_transfer.plan.shard_assembly import assembly_plan, whole_shape
from rose_transfer.plan.shard_spec import ShardSpec
from rose_transfer.plan.shard_view import view_version
from rose_transfer.version.manifest import flatten, tensor_views

SPECS = {
    "embed.weight": "vocab;pad=16",
    "qkv.weight": "qkv;sections=32@4,8@4,8@4",  # 8 heads, 2 KV heads of 4
    "o.weight": "row",
    "gate_up.weight": "gate_up;sections=24,24",
    "bias": "column",
}


def _full(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((50, 12)).astype(np.float16),
        "qkv.weight": rng.standard_normal((48, 12), dtype=np.float32),
        "o.weight": rng.standard_normal((12, 32), dtype=np.float32),
        "norm.weight": rng.standard_normal(12, dtype=np.float32),
        "gate_up.weight": rng.standard_normal((48, 12)).astype(np.float16),
        "bias": rng.integers(0, 100, 8, dtype=np.int64),
    }


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_every_ranks_shards_assemble_to_the_flattened_full_model(ranks: int) -> None:
    whole = flatten(_full(), version=3, bucket_bytes=512, shards=SPECS)
    shards = {rank: view_version(whole, ShardView(tp=ranks, rank=rank)) for rank in range(ranks)}
    offers = {  # a rank offers its local entries with the spec text it was given
        rank: [msgspec.structs.replace(e, shard=SPECS.get(e.name, "replicated")) for e in flat.manifest.tensors]
        for rank, flat in shards.items()
    }
    plan = assembly_plan(offers, ranks)
    stream = np.full(plan.total, 0xAB, dtype=np.uint8)
    plan.zero_padding(stream)
    for rank, flat in shards.items():
        local = tensor_views(flat.stream, flat.manifest.tensors)
        for name in plan.sends(rank):
            plan.fill(rank, name, local[name].reshape(-1).view(np.uint8), stream)
    assembled = plan.version(stream, version=3, bucket_bytes=512)
    assert assembled.manifest.digest == whole.manifest.digest
    assert np.array_equal(assembled.stream, whole.stream)
    if ranks > 1:
        assert "norm.weight" not in plan.sends(1)  # a replicated tensor comes from rank 0 only


def test_whole_shape_of_an_uneven_vocab_split_is_the_sum_of_its_rows() -> None:
    assert whole_shape(ShardSpec.parse("vocab;pad=64"), [(64, 8), (36, 8)]) == [100, 8]
    with pytest.raises(RoseError, match="rank 0 holds shape \\[60, 8\\]"):
        whole_shape(ShardSpec.parse("vocab;pad=64"), [(60, 8), (40, 8)])  # rank 0 must hold 64 rows


def test_sections_that_do_not_match_the_shards_are_named() -> None:
    with pytest.raises(RoseError, match="fix the shard spec"):
        whole_shape(ShardSpec.parse("gate_up;sections=24,24"), [(20, 8), (20, 8)])
    with pytest.raises(RoseError, match="no dimension 1"):
        whole_shape(ShardSpec.parse("row"), [(8,), (8,)])
