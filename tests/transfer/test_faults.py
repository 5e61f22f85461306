"""Dropped connections, corrupted buckets and failed fetches: a version is applied whole or not at all."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from faulty_proxy import FaultyProxy
from rose_core.protocol.messages import WeightAnnounce
from rose_transfer import DensePublisher, TransferError, WeightFetcher, load_arrays
from rose_transfer.metrics import BUCKET_RETRIES, RECONNECTS

from .conftest import SECRET, assert_same, random_state_dict

BUCKET = 16 * 1024


def _via(announce: WeightAnnounce, proxy: FaultyProxy) -> WeightAnnounce:
    return WeightAnnounce(
        version=announce.version,
        step=announce.step,
        source=proxy.source,
        manifest_digest=announce.manifest_digest,
        total_bytes=announce.total_bytes,
    )


def _counter(metric: Any) -> float:
    return REGISTRY.get_sample_value(metric._name + "_total") or 0.0


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
async def proxies() -> AsyncIterator[list[FaultyProxy]]:
    started: list[FaultyProxy] = []
    yield started
    for proxy in started:
        await proxy.close()


async def test_connection_dropped_mid_bucket_resumes_with_missing_buckets(
    publisher: DensePublisher, proxies: list[FaultyProxy], tmp_path: Path
) -> None:
    tensors = random_state_dict(seed=3, scale=4)  # about 250 KB: 16 buckets of 16 KiB
    announce = publisher.publish(1, 0, tensors)
    cut_at = announce.total_bytes // 2 + BUCKET // 3  # inside a bucket's payload
    proxy = await FaultyProxy(publisher.port, cuts=[cut_at]).start()
    proxies.append(proxy)
    reconnects = _counter(RECONNECTS)
    fetched = await WeightFetcher(SECRET, "r", window=2).fetch(_via(announce, proxy), -1, tmp_path / "v1.bin")
    assert proxy.cut == 1 and proxy.connections == 2
    assert _counter(RECONNECTS) == reconnects + 1
    # The second connection only carried what the first did not finish (plus a few in-flight buckets).
    assert fetched.bytes_received < announce.total_bytes + 4 * BUCKET + 8 * 1024
    assert_same(load_arrays(fetched), tensors)
    assert _leftovers(tmp_path) == ["v1.bin"]


async def test_a_stalled_connection_times_out_and_resumes(
    publisher: DensePublisher, proxies: list[FaultyProxy], tmp_path: Path
) -> None:
    tensors = random_state_dict(seed=7, scale=4)
    announce = publisher.publish(1, 0, tensors)
    proxy = await FaultyProxy(publisher.port, stalls=[announce.total_bytes // 2]).start()
    proxies.append(proxy)
    fetcher = WeightFetcher(SECRET, "r", timeout=0.3)
    fetched = await fetcher.fetch(_via(announce, proxy), -1, tmp_path / "v1.bin")
    assert proxy.stalled == 1 and proxy.connections == 2
    assert_same(load_arrays(fetched), tensors)


async def test_corrupted_bucket_in_transit_is_detected_and_fetched_again(
    publisher: DensePublisher, proxies: list[FaultyProxy], tmp_path: Path
) -> None:
    tensors = random_state_dict(seed=4, scale=4)
    announce = publisher.publish(1, 0, tensors)
    proxy = await FaultyProxy(publisher.port, flip_at=announce.total_bytes // 3).start()
    proxies.append(proxy)
    retries = _counter(BUCKET_RETRIES)
    fetched = await WeightFetcher(SECRET, "r").fetch(_via(announce, proxy), -1, tmp_path / "v1.bin")
    assert proxy.flipped and proxy.connections == 1
    assert _counter(BUCKET_RETRIES) == retries + 1
    assert_same(load_arrays(fetched), tensors)


async def test_corrupt_publisher_copy_fails_cleanly_after_bounded_retries(
    publisher: DensePublisher, fetcher: WeightFetcher, tmp_path: Path
) -> None:
    """The publisher's copy no longer matches its manifest checksum (signed, so only the checksum catches it)."""
    announce = publisher.publish(1, 0, random_state_dict(seed=5, scale=4))
    served = publisher._store.get(1)  # simulate memory corruption on the publisher
    assert served is not None
    served.flat.stream[BUCKET * 2 + 5] ^= 1
    dest = tmp_path / "v1.bin"
    dest.write_bytes(b"the version applied before")
    with pytest.raises(TransferError, match=r"bucket 2 of weight version 1 failed 4 times \(checksum mismatch\)"):
        await fetcher.fetch(announce, -1, dest)
    assert dest.read_bytes() == b"the version applied before"
    assert _leftovers(tmp_path) == ["v1.bin"]


async def test_unreachable_publisher_fails_after_bounded_reconnects(tmp_path: Path) -> None:
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0) as gone:
        announce = gone.publish(1, 0, random_state_dict())
    fetcher = WeightFetcher(SECRET, "r", max_reconnects=2, timeout=2.0)
    with pytest.raises(TransferError, match=r"cannot fetch weight version 1 .*3 tries.*check that the publisher runs"):
        await fetcher.fetch(announce, -1, tmp_path / "v1.bin")
    assert _leftovers(tmp_path) == []


async def test_every_connection_cut_means_no_file(
    publisher: DensePublisher, proxies: list[FaultyProxy], tmp_path: Path
) -> None:
    announce = publisher.publish(1, 0, random_state_dict(seed=6, scale=4))
    # The first connection gets half the version; every later one is cut during the handshake.
    proxy = await FaultyProxy(publisher.port, cuts=[announce.total_bytes // 2] + [60] * 10).start()
    proxies.append(proxy)
    fetcher = WeightFetcher(SECRET, "r", max_reconnects=2, timeout=2.0)
    with pytest.raises(TransferError, match=r"cannot fetch weight version 1 .*3 tries"):
        await fetcher.fetch(_via(announce, proxy), -1, tmp_path / "v1.bin")
    assert proxy.connections == 4
    assert _leftovers(tmp_path) == []


async def test_an_unusable_destination_is_a_clear_error_without_retries(
    publisher: DensePublisher, fetcher: WeightFetcher, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    announce = publisher.publish(1, 0, random_state_dict())
    reconnects = _counter(RECONNECTS)
    with pytest.raises(TransferError, match=r"cannot hold \d+ bytes of weights at .*not-a-directory"):
        await fetcher.fetch(announce, -1, blocker / "v1.bin")
    assert _counter(RECONNECTS) == reconnects
