from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

from rose_core.app.weight_publisher import load_publisher
from rose_core.protocol.messages import WeightAnnounce
from rose_core.support.errors import ConfigError, RoseError
from rose_transfer import DensePublisher, TransferError, WeightFetcher, load_arrays

from .conftest import SECRET, assert_same, random_state_dict


async def test_random_state_dict_round_trips_bit_exact(
    publisher: DensePublisher, fetcher: WeightFetcher, tmp_path: Path
) -> None:
    tensors = random_state_dict(seed=1)
    announce = publisher.publish(1, step=10, tensors=tensors)
    assert announce.source == publisher.source and announce.source.startswith("tcp://127.0.0.1:")
    fetched = await fetcher.fetch(announce, have_version=-1, dest=tmp_path / "v1.bin")
    assert fetched.version == 1 and fetched.path == tmp_path / "v1.bin"
    assert fetched.path.stat().st_size == announce.total_bytes
    assert fetched.digest == announce.manifest_digest
    assert fetched.bytes_received >= announce.total_bytes
    assert fetched.seconds > 0
    assert_same(load_arrays(fetched), tensors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1.bin"]  # no temp file left


async def test_multi_bucket_version_with_large_buckets(tmp_path: Path) -> None:
    tensors = random_state_dict(seed=2, scale=200)  # about 8 MB
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=1024 * 1024) as publisher:
        announce = publisher.publish(5, 1, tensors)
        assert announce.total_bytes > 5 * 1024 * 1024
        fetched = await WeightFetcher(SECRET, "r", window=2).fetch(announce, -1, tmp_path / "v5.bin")
    assert_same(load_arrays(fetched), tensors)


async def test_keeps_the_last_two_versions(publisher: DensePublisher, fetcher: WeightFetcher, tmp_path: Path) -> None:
    announces = [publisher.publish(v, v, random_state_dict(seed=v)) for v in (1, 2, 3)]
    assert publisher.versions() == [2, 3]
    for announce in announces[1:]:
        fetched = await fetcher.fetch(announce, -1, tmp_path / f"v{announce.version}.bin")
        assert_same(load_arrays(fetched), random_state_dict(seed=announce.version))
    with pytest.raises(
        TransferError, match=r"weight version 1 is not served here \(the publisher keeps versions \[2, 3\]\)"
    ):
        await fetcher.fetch(announces[0], -1, tmp_path / "v1.bin")
    assert not (tmp_path / "v1.bin").exists()


async def test_unknown_version_is_a_clear_error(
    publisher: DensePublisher, fetcher: WeightFetcher, tmp_path: Path
) -> None:
    publisher.publish(1, 0, random_state_dict())
    announce = WeightAnnounce(version=9, step=0, source=publisher.source)
    with pytest.raises(
        TransferError, match=r"cannot fetch weight version 9 .*fetch the version of the newest announce"
    ):
        await fetcher.fetch(announce, -1, tmp_path / "v9.bin")
    assert list(tmp_path.iterdir()) == []


async def test_a_wrong_digest_in_the_announce_is_refused(
    publisher: DensePublisher, fetcher: WeightFetcher, tmp_path: Path
) -> None:
    announce = publisher.publish(1, 0, random_state_dict())
    forged = WeightAnnounce(version=1, step=0, source=announce.source, manifest_digest="f" * 32)
    with pytest.raises(TransferError, match="digest does not match"):
        await fetcher.fetch(forged, -1, tmp_path / "v1.bin")


async def test_empty_version_round_trips(publisher: DensePublisher, fetcher: WeightFetcher, tmp_path: Path) -> None:
    fetched = await fetcher.fetch(publisher.publish(1, 0, {}), -1, tmp_path / "v1.bin")
    assert fetched.entries == [] and fetched.path.read_bytes() == b""
    assert load_arrays(fetched) == {}


async def test_a_new_fetch_replaces_an_older_file_atomically(
    publisher: DensePublisher, fetcher: WeightFetcher, tmp_path: Path
) -> None:
    dest = tmp_path / "current.bin"
    dest.write_bytes(b"old version")
    fetched = await fetcher.fetch(publisher.publish(1, 0, random_state_dict()), -1, dest)
    assert_same(load_arrays(fetched), random_state_dict())


async def test_concurrent_receivers(publisher: DensePublisher, tmp_path: Path) -> None:
    import asyncio

    announce = publisher.publish(4, 0, random_state_dict(seed=4, scale=20))
    fetchers = [WeightFetcher(SECRET, f"r{i}") for i in range(4)]
    results = await asyncio.gather(*(f.fetch(announce, -1, tmp_path / f"r{i}.bin") for i, f in enumerate(fetchers)))
    for fetched in results:
        assert_same(load_arrays(fetched), random_state_dict(seed=4, scale=20))


def test_versions_must_increase(publisher: DensePublisher) -> None:
    publisher.publish(3, 0, random_state_dict())
    with pytest.raises(RoseError, match="not newer than the published 3"):
        publisher.publish(3, 1, random_state_dict())


def test_busy_port_is_one_clear_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(RoseError, match=rf"cannot serve weights on 127.0.0.1:{port} .*pick a free port"):
            DensePublisher(secret=SECRET, host="127.0.0.1", port=port)


def test_short_secret_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        DensePublisher(secret=b"short", host="127.0.0.1", port=0)
    with pytest.raises(ConfigError, match="at least 16"):
        WeightFetcher(b"short", "r")


def test_close_is_idempotent_and_stops_serving(publisher: DensePublisher) -> None:
    port = publisher.port
    publisher.close()
    publisher.close()
    with pytest.raises(RoseError, match="closed"):
        publisher.publish(1, 0, {})
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_entry_point_loads_the_dense_publisher() -> None:
    publisher = load_publisher("dense", secret=SECRET, host="127.0.0.1", port=0)
    try:
        assert isinstance(publisher, DensePublisher)
        assert publisher.publish(0, 0, {"w": np.ones(3)}).version == 0
    finally:
        publisher.close()
