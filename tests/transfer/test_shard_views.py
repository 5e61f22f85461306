"""Shard views: a tensor-parallel receiver pulls, patches and checksums only its slice of each tensor,
and holds it as its engine's local tensors (checked against plain numpy slicing)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from rose_core.protocol.messages import ShardView
from rose_core.support.errors import RoseError
from rose_transfer import ResidentWeights, TransferError, WeightFetcher
from rose_transfer.serve.relay import Relay
from rose_transfer.serve.sparse_publisher import SparsePublisher
from rose_transfer.version.manifest import check_manifest

from .conftest import SECRET, assert_same
from .test_sparse_relay import _next_version

SHARDS = {"attn.q.weight": "column", "attn.o.weight": "row", "embed.weight": "vocab"}


def _state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((256, 48), dtype=np.float32).astype(np.float16),
        "attn.q.weight": rng.standard_normal((96, 64), dtype=np.float32),
        "attn.o.weight": rng.standard_normal((64, 96), dtype=np.float32),
        "norm.weight": np.ones(64, dtype=np.float32),
    }


def _slices(state: dict[str, np.ndarray], tp: int, rank: int) -> dict[str, np.ndarray]:
    """What rank ``rank`` of ``tp`` should hold, by plain slicing."""
    out = {}
    for name, array in state.items():
        dim = {"column": 0, "vocab": 0, "row": 1}.get(SHARDS.get(name, ""))
        if dim is None:
            out[name] = array
            continue
        size = array.shape[dim] // tp
        out[name] = np.take(array, range(rank * size, (rank + 1) * size), axis=dim)
    return out


@pytest.fixture
def sparse() -> Iterator[SparsePublisher]:
    pub = SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=8 * 1024)
    yield pub
    pub.close()


def test_each_rank_holds_its_slices_and_later_versions_travel_as_patches(sparse: SparsePublisher) -> None:
    state = _state()
    whole = sum(a.nbytes for a in state.values())
    announce = sparse.publish(0, 0, state, shards=SHARDS)
    targets = {rank: ResidentWeights() for rank in (0, 1)}
    fetchers = {rank: WeightFetcher(SECRET, f"rank{rank}", timeout=5.0) for rank in (0, 1)}
    for rank, target in targets.items():
        fetched = asyncio.run(fetchers[rank].fetch_into(announce, target, view=ShardView(tp=2, rank=rank)))
        assert_same(target.arrays(), _slices(state, 2, rank))
        assert fetched.bytes_received < whole * 0.6  # half of each sharded tensor, all of the norm
    for version in (1, 2):
        state = {name: array for name, array in _next_version(state, version).items()}
        announce = sparse.publish(version, version, state, shards=SHARDS)
        for rank, target in targets.items():
            fetched = asyncio.run(fetchers[rank].fetch_into(announce, target, view=ShardView(tp=2, rank=rank)))
            assert fetched.patched_buckets > 0 and fetched.bytes_received < whole * 0.2
            assert_same(target.arrays(), _slices(state, 2, rank))


def test_views_through_one_relay_are_exact_for_every_rank(sparse: SparsePublisher) -> None:
    state = _state(1)
    with Relay(secret=SECRET, upstream=sparse.source) as relay:
        for version in (0, 1):
            announce = sparse.publish(version, version, state, shards=SHARDS)
            for rank in range(4):
                target = ResidentWeights()
                fetcher = WeightFetcher(SECRET, f"r{rank}", timeout=5.0)
                asyncio.run(fetcher.fetch_into(announce, target, relay=relay.source, view=ShardView(tp=4, rank=rank)))
                assert_same(target.arrays(), _slices(state, 4, rank))
            state = _next_version(state, 7)
        assert relay.upstream_bytes > 0


def test_holding_another_shard_means_a_full_sync(sparse: SparsePublisher) -> None:
    state = _state(2)
    fetcher, target = WeightFetcher(SECRET, "mover", timeout=5.0), ResidentWeights()
    asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, state, shards=SHARDS), target, view=ShardView(tp=2, rank=0)))
    state = _next_version(state, 3)
    announce = sparse.publish(1, 1, state, shards=SHARDS)
    fetched = asyncio.run(fetcher.fetch_into(announce, target, view=ShardView(tp=2, rank=1)))
    assert fetched.patched_buckets == 0
    assert_same(target.arrays(), _slices(state, 2, 1))
    asyncio.run(fetcher.fetch_into(announce, target))  # and back to the whole version
    assert_same(target.arrays(), state)


def test_a_manifest_of_another_view_or_version_is_refused(sparse: SparsePublisher) -> None:
    state = _state(3)
    announce = sparse.publish(0, 0, state, shards=SHARDS)
    target = ResidentWeights()
    fetcher = WeightFetcher(SECRET, "checker", timeout=5.0)
    asyncio.run(fetcher.fetch_into(announce, target, view=ShardView(tp=2, rank=1)))
    assert target.manifest is not None and target.manifest.source_digest == announce.manifest_digest
    with pytest.raises(TransferError, match="view"):
        check_manifest(target.manifest, version=0, digest=announce.manifest_digest, view=ShardView(tp=2, rank=0))
    with pytest.raises(TransferError, match="digest"):
        check_manifest(target.manifest, version=0, digest="0" * 32, view=ShardView(tp=2, rank=1))
    with pytest.raises(RoseError, match=r"rank 0\.\.tp-1"):
        asyncio.run(fetcher.fetch_into(announce, target, view=ShardView(tp=2, rank=2)))


def test_a_view_the_version_cannot_be_cut_into_is_refused_with_the_reason(sparse: SparsePublisher) -> None:
    announce = sparse.publish(0, 0, _state(5), shards=SHARDS)
    fetcher = WeightFetcher(SECRET, "odd", timeout=5.0)
    with pytest.raises(TransferError, match=r"tensor-parallel degree 5.*divides it"):
        asyncio.run(fetcher.fetch_into(announce, ResidentWeights(), view=ShardView(tp=5, rank=0)))
    target = ResidentWeights()  # the publisher still serves everyone else
    asyncio.run(fetcher.fetch_into(announce, target, view=ShardView(tp=2, rank=0)))
    assert_same(target.arrays(), _slices(_state(5), 2, 0))
