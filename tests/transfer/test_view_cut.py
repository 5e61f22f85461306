"""Shard views cut bucket by bucket from the whole stream (what a publisher serves) are the views
``view_version`` cuts whole: same manifest, same bytes, for buckets that split rows anywhere."""

from __future__ import annotations

import numpy as np
import pytest

from rose_core.protocol.messages import ShardView
from rose_transfer import SparsePublisher
from rose_transfer.plan.shard_view import view_version
from rose_transfer.plan.view_cut import view_cut, view_manifest
from rose_transfer.version.manifest import flatten

from .conftest import SECRET

SHARDS = {"q": "column", "o": "row", "e": "vocab", "o2": "row"}


def _state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "e": rng.standard_normal((256, 48)).astype(np.float16),
        "q": rng.standard_normal((96, 64), dtype=np.float32),
        "o": rng.standard_normal((64, 96), dtype=np.float32),
        "n": np.ones(63, dtype=np.float32),  # leaves padding before the next tensor
        "o2": rng.standard_normal((30, 50)).astype(np.float16),  # rows of 25 halves per rank
    }


@pytest.mark.parametrize("bucket_bytes", [7, 64, 100, 1000, 4096, 1 << 20])
@pytest.mark.parametrize(("tp", "rank"), [(1, 0), (2, 0), (2, 1)])
def test_each_bucket_cut_alone_is_the_bucket_of_the_whole_cut(bucket_bytes: int, tp: int, rank: int) -> None:
    whole = flatten(_state(), version=3, bucket_bytes=bucket_bytes, shards=SHARDS)
    view = ShardView(tp=tp, rank=rank)
    reference = view_version(whole, view)
    cut = view_cut(whole.manifest, view)
    scratch = np.full(bucket_bytes, 7, dtype=np.uint8)  # stale bytes: padding must be zeroed
    assert view_manifest(whole.manifest, cut, whole.stream, scratch) == reference.manifest
    for index in range(cut.bucket_count()):
        assert np.array_equal(cut.cut(index, whole.stream, scratch), reference.bucket(index)), index


def test_a_publisher_hands_out_a_view_stream_of_its_own() -> None:
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=1000) as publisher:
        publisher.publish(0, 0, _state(), shards=SHARDS)
        view = ShardView(tp=2, rank=1)
        got = publisher.stream(0, view)
        whole = publisher.stream(0)
        assert not np.shares_memory(got, whole)
        want = view_version(flatten(_state(), version=0, bucket_bytes=1000, shards=SHARDS), view).stream
        assert np.array_equal(got, want)
