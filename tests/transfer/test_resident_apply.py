"""Versions applied in place to weights held in memory (``WeightFetcher.fetch_into``): O(changes),
whole or not at all, from the base the receiver holds, else a full sync."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from rose_transfer import ResidentWeights, TransferError, WeightFetcher, flatten
from rose_transfer.codec.bucket_codec import encode_bucket
from rose_transfer.resident.resident_commit import commit
from rose_transfer.serve.sparse_publisher import SparsePublisher

from .conftest import SECRET, assert_same, random_state_dict
from .test_sparse_relay import _next_version


@pytest.fixture
def sparse() -> Iterator[SparsePublisher]:
    pub = SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=16 * 1024)
    yield pub
    pub.close()


def _fetcher(**kwargs: int) -> WeightFetcher:
    return WeightFetcher(SECRET, "resident", timeout=5.0, **kwargs)


def test_a_sequence_of_versions_is_bit_exact_and_travels_as_patches(sparse: SparsePublisher) -> None:
    fetcher, target = _fetcher(), ResidentWeights()
    state = random_state_dict(scale=20)
    full = asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, state), target))
    for version in (1, 2, 3):
        state = _next_version(state, version)
        fetched = asyncio.run(fetcher.fetch_into(sparse.publish(version, version, state), target))
        assert target.version == version
        assert_same(target.arrays(), state)
        assert fetched.patched_buckets > 0
        assert fetched.bytes_received < full.bytes_received / 5


def test_patches_land_in_the_same_memory(sparse: SparsePublisher) -> None:
    fetcher, target = _fetcher(), ResidentWeights()
    state = random_state_dict(scale=20)
    asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, state), target))
    before = target.stream.ctypes.data
    asyncio.run(fetcher.fetch_into(sparse.publish(1, 1, _next_version(state, 1)), target))
    assert target.stream.ctypes.data == before


def test_a_patch_that_does_not_reconstruct_rolls_the_whole_version_back() -> None:
    v0, v1 = random_state_dict(scale=20), None
    v1 = _next_version(v0, 1)
    old, new = flatten(v0, version=0, bucket_bytes=16 * 1024), flatten(v1, version=1, bucket_bytes=16 * 1024)
    target = ResidentWeights()
    target.stream = old.stream.copy()
    target.set_version(old.manifest, frozenset(range(len(old.manifest.buckets))))
    patches = {}
    for index in range(len(new.manifest.buckets)):
        encoded = encode_bucket(old.bucket(index), new.bucket(index), word_bytes=2)
        patches[index] = np.frombuffer(encoded.payload, np.uint8).copy()
    last = max(i for i, p in patches.items() if p.nbytes < new.bucket(i).nbytes)
    patches[last][-3] ^= 0xFF  # a new value of the last patched bucket, corrupted
    failed = commit(target, new.manifest, patches, set(), None)
    assert failed == [last]
    assert target.version == 0
    assert target.stream.tobytes() == old.stream.tobytes()


def test_a_diverged_base_is_rolled_back_then_fixed_dense(sparse: SparsePublisher) -> None:
    fetcher, target = _fetcher(), ResidentWeights()
    v0 = random_state_dict(scale=20)
    asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, v0), target))
    target.stream[100] ^= 0x01  # the held base rotted: its patch will not reconstruct
    v1 = _next_version(v0, 1)
    asyncio.run(fetcher.fetch_into(sparse.publish(1, 1, v1), target))
    assert_same(target.arrays(), v1)


def test_a_version_that_cannot_be_applied_leaves_the_previous_one(sparse: SparsePublisher) -> None:
    fetcher, target = _fetcher(max_bucket_retries=0), ResidentWeights()
    v0 = random_state_dict(scale=20)
    asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, v0), target))
    target.stream[100] ^= 0x01
    held = target.stream.copy()
    with pytest.raises(TransferError):
        asyncio.run(fetcher.fetch_into(sparse.publish(1, 1, _next_version(v0, 1)), target))
    assert target.version == 0
    assert target.stream.tobytes() == held.tobytes()


def test_a_receiver_without_the_publishers_base_gets_a_full_sync(sparse: SparsePublisher) -> None:
    fetcher, target = _fetcher(), ResidentWeights()
    v0 = random_state_dict(scale=20)
    asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, v0), target))
    v1 = _next_version(v0, 1)
    sparse.publish(1, 1, v1)
    v2 = _next_version(v1, 2)
    fetched = asyncio.run(fetcher.fetch_into(sparse.publish(2, 2, v2), target))  # v0 is no longer kept
    assert fetched.patched_buckets == 0
    assert_same(target.arrays(), v2)


def test_a_target_of_another_layout_gets_a_full_sync(sparse: SparsePublisher) -> None:
    fetcher, target = _fetcher(), ResidentWeights()
    asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, random_state_dict(scale=5)), target))
    bigger = random_state_dict(scale=20)
    fetched = asyncio.run(fetcher.fetch_into(sparse.publish(1, 1, bigger), target))
    assert fetched.patched_buckets == 0
    assert_same(target.arrays(), bigger)


def test_a_shard_pulls_only_its_buckets(sparse: SparsePublisher) -> None:
    fetcher, target = _fetcher(), ResidentWeights()
    v0 = random_state_dict(scale=20)
    wanted = {0, 2}
    asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, v0), target, buckets=wanted))
    v1 = _next_version(v0, 1)
    asyncio.run(fetcher.fetch_into(sparse.publish(1, 1, v1), target, buckets=wanted))
    expected = flatten(v1, version=1, bucket_bytes=16 * 1024)
    assert target.valid == frozenset(wanted)
    for index in wanted:
        info = expected.manifest.buckets[index]
        assert target.stream[info.offset : info.offset + info.nbytes].tobytes() == expected.bucket(index).tobytes()
