"""Buffer recycling: a publisher's new versions land in retired versions' buffers, and a recycled
buffer never aliases bytes anyone still holds (a version still served, a reply still being sent)."""

from __future__ import annotations

import gc

import numpy as np

from rose_transfer import SparsePublisher
from rose_transfer.version.buffer_pool import BufferPool

from .conftest import SECRET, random_state_dict

MIB = 1024 * 1024


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def test_a_buffer_comes_back_only_when_nothing_derived_from_it_is_alive() -> None:
    pool = BufferPool()
    buffer = pool.take(MIB)
    first = _address(buffer)
    held = memoryview(buffer[100:200].view(np.uint16))  # what a frame being sent holds
    del buffer
    gc.collect()
    assert pool.free_buffers(MIB) == 0
    other = pool.take(MIB)
    assert not np.shares_memory(other, np.frombuffer(held, dtype=np.uint8))
    del held
    assert pool.free_buffers(MIB) == 1
    again = pool.take(MIB)
    assert _address(again) == first and pool.recycled == 1 and pool.allocated == 2
    del other, again


def test_buffers_of_other_sizes_are_not_mixed_up() -> None:
    pool = BufferPool()
    pool.take(MIB)  # freed at once
    assert pool.free_buffers(MIB) == 1
    assert pool.take(2 * MIB).nbytes == 2 * MIB and pool.free_buffers(MIB) == 1


def test_a_publisher_builds_new_versions_in_retired_versions_buffers() -> None:
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=16 * 1024) as publisher:
        addresses = {}
        for version in range(5):
            publisher.publish(version, version, random_state_dict(seed=version))
            addresses[version] = _address(publisher.stream(version))
        assert publisher.versions() == [3, 4]
        # keep 2: publishing v3 found v0's stream free (v0 left when v2 came), v4 took v1's
        assert addresses[3] == addresses[0] and addresses[4] == addresses[1]


def test_a_stream_still_held_is_never_recycled() -> None:
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=16 * 1024) as publisher:
        publisher.publish(0, 0, random_state_dict(seed=0))
        in_flight = publisher.stream(0)[1000:5000]  # a reply of version 0 still being sent
        kept = in_flight.copy()
        for version in range(1, 5):
            publisher.publish(version, version, random_state_dict(seed=version))
            for live in publisher.versions():
                assert live == 0 or not np.shares_memory(publisher.stream(live), in_flight)
        assert np.array_equal(in_flight, kept)  # nobody wrote over the evicted version's bytes
        assert 0 not in publisher.versions()
