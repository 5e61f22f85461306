"""The sparse publisher, the fetcher's held base, shard subsets and relays (with their faults)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest

from rose_transfer import WeightFetcher, flatten, load_arrays
from rose_transfer.bench.link_pacer import LinkPacer, open_link
from rose_transfer.bench.transfer_plan import Receiver, plan_transfer
from rose_transfer.serve.relay import Relay
from rose_transfer.serve.sparse_publisher import SparsePublisher

from .conftest import SECRET, assert_same, random_state_dict


def _next_version(state: dict[str, np.ndarray], seed: int, fraction: float = 0.01) -> dict[str, np.ndarray]:
    """``state`` with about ``fraction`` of the elements of each float tensor replaced."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, array in state.items():
        new = array.copy()
        if array.dtype.kind == "f" and array.size:
            flat = new.reshape(-1)
            picked = rng.random(flat.size) < fraction
            flat[picked] = rng.standard_normal(int(picked.sum())).astype(array.dtype)
        out[name] = new
    return out


@pytest.fixture
def sparse() -> Iterator[SparsePublisher]:
    pub = SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=16 * 1024)
    yield pub
    pub.close()


def test_second_version_travels_as_patches(sparse: SparsePublisher, tmp_path: Path) -> None:
    v0 = random_state_dict(scale=20)
    v1 = _next_version(v0, 1)
    fetcher = WeightFetcher(SECRET, "r0", timeout=5.0)
    first = asyncio.run(fetcher.fetch(sparse.publish(0, 0, v0), -1, tmp_path / "v0.bin"))
    second = asyncio.run(fetcher.fetch(sparse.publish(1, 1, v1), 0, tmp_path / "v1.bin"))
    assert_same(load_arrays(second), v1)
    assert second.bytes_received < first.bytes_received / 5


def test_receiver_without_the_base_gets_a_full_sync(sparse: SparsePublisher, tmp_path: Path) -> None:
    v0 = random_state_dict(scale=20)
    v1 = _next_version(v0, 1)
    sparse.publish(0, 0, v0)
    announce = sparse.publish(1, 1, v1)
    restarted = WeightFetcher(SECRET, "r0", timeout=5.0)  # says it holds 0, but has no file of it
    fetched = asyncio.run(restarted.fetch(announce, 0, tmp_path / "v1.bin"))
    assert_same(load_arrays(fetched), v1)
    assert fetched.bytes_received >= announce.total_bytes


def test_relay_serves_a_cluster_and_dies_into_fallback(sparse: SparsePublisher, tmp_path: Path) -> None:
    v0 = random_state_dict(scale=20)
    v1 = _next_version(v0, 2)
    a0 = sparse.publish(0, 0, v0)
    relay = Relay(secret=SECRET, upstream=sparse.source)
    fetchers = [WeightFetcher(SECRET, f"r{i}", timeout=5.0) for i in range(2)]

    async def both(announce, have, name):  # type: ignore[no-untyped-def]
        return await asyncio.gather(
            *(f.fetch(announce, have, tmp_path / f"{name}-{i}.bin", relay=relay.source) for i, f in enumerate(fetchers))
        )

    asyncio.run(both(a0, -1, "v0"))
    upstream_v0 = relay.upstream_bytes
    assert upstream_v0 < 1.5 * a0.total_bytes  # pulled once for two receivers
    relay.close()  # dies: the next version comes from the source
    got = asyncio.run(both(sparse.publish(1, 1, v1), 0, "v1"))
    for fetched in got:
        assert_same(load_arrays(fetched), v1)


def test_shard_subset_pulls_only_its_buckets(sparse: SparsePublisher, tmp_path: Path) -> None:
    v0 = random_state_dict(scale=20)
    announce = sparse.publish(0, 0, v0)
    fetcher = WeightFetcher(SECRET, "r0", timeout=5.0)
    fetched = asyncio.run(fetcher.fetch(announce, -1, tmp_path / "v0.bin", buckets=[0, 2]))
    assert fetched.bytes_received < 3 * 16 * 1024 + 64 * 1024


def _slow_link(publisher: SparsePublisher, mbps: float) -> str:
    return open_link(publisher, LinkPacer(mbps * 1e6 / 8, burst_bytes=16 * 1024))


def test_relay_dying_mid_transfer_falls_back_bit_exact(sparse: SparsePublisher, tmp_path: Path) -> None:
    v0 = random_state_dict(scale=40)
    announce = sparse.publish(0, 0, v0)
    relay = Relay(secret=SECRET, upstream=_slow_link(sparse, 8))  # ~1 MB/s into the relay's cluster
    killer = threading.Timer(0.15, relay.close)
    killer.start()
    fetchers = [WeightFetcher(SECRET, f"r{i}", timeout=5.0) for i in range(2)]

    async def both():  # type: ignore[no-untyped-def]
        return await asyncio.gather(
            *(f.fetch(announce, -1, tmp_path / f"r{i}.bin", relay=relay.source) for i, f in enumerate(fetchers))
        )

    got = asyncio.run(both())
    killer.join()
    assert relay.upstream_bytes < announce.total_bytes  # it died before finishing
    for fetched in got:
        assert_same(load_arrays(fetched), v0)


def test_receiver_restarting_mid_transfer_gets_a_full_sync(sparse: SparsePublisher, tmp_path: Path) -> None:
    v0 = random_state_dict(scale=40)
    v1 = _next_version(v0, 3)
    a0 = sparse.publish(0, 0, v0)
    first = WeightFetcher(SECRET, "r0", timeout=5.0)
    asyncio.run(first.fetch(a0, -1, tmp_path / "v0.bin"))
    a1 = sparse.publish(1, 1, v1)
    slow = msgspec.structs.replace(a1, source=_slow_link(sparse, 2))

    async def interrupted() -> None:
        task = asyncio.ensure_future(first.fetch(slow, 0, tmp_path / "v1.bin"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(interrupted())
    assert not (tmp_path / "v1.bin").exists()  # nothing partial was applied
    assert [p.name for p in tmp_path.iterdir()] == ["v0.bin"]  # and no temp file is left
    restarted = WeightFetcher(SECRET, "r0", timeout=5.0)  # a new process: it holds no base it knows
    fetched = asyncio.run(restarted.fetch(a1, 0, tmp_path / "v1.bin"))
    assert_same(load_arrays(fetched), v1)
    assert fetched.bytes_received >= a1.total_bytes


def test_plan_crosses_each_bucket_once_per_cluster() -> None:
    state = random_state_dict(scale=20)
    flat = flatten(
        state, version=0, bucket_bytes=4096, shards={"embed.weight": "vocab", "layers.0.attn.qkv.weight": "column"}
    )
    receivers = [Receiver(f"r{i}", cluster=i // 2, tp=2, rank=i % 2) for i in range(6)]
    plan = plan_transfer(flat.manifest, receivers)
    dense = sum(b.nbytes for b in flat.manifest.buckets)
    assert plan.cross_cluster_bytes <= 2 * dense  # two remote clusters, each bucket at most once
    assert plan.route["c1/r2"] == "c1/relay"
    assert {h.receiver for h in plan.hops if h.crosses} == {"c1/relay", "c2/relay"}


def test_sparse_is_a_registered_weight_publisher() -> None:
    from rose_core.app.weight_publisher import load_publisher

    publisher = load_publisher("sparse", secret=SECRET, host="127.0.0.1", port=0)
    try:
        assert isinstance(publisher, SparsePublisher)
    finally:
        publisher.close()


def test_a_diverged_base_is_caught_and_the_bucket_pulled_dense(sparse: SparsePublisher, tmp_path: Path) -> None:
    v0 = random_state_dict(scale=20)
    v1 = _next_version(v0, 4)
    fetcher = WeightFetcher(SECRET, "r0", timeout=5.0)
    held = asyncio.run(fetcher.fetch(sparse.publish(0, 0, v0), -1, tmp_path / "v0.bin"))
    with open(held.path, "r+b") as f:  # the held copy rots on disk
        f.seek(100)
        f.write(b"\xff" * 64)
    fetched = asyncio.run(fetcher.fetch(sparse.publish(1, 1, v1), 0, tmp_path / "v1.bin"))
    assert_same(load_arrays(fetched), v1)


def test_a_relay_carries_dense_buckets_larger_than_the_default_message_limit(
    sparse: SparsePublisher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full sync through a relay: the default 64 MiB bucket is larger than the default message
    limit; the relay's link takes its limit from the manifest (scaled down here)."""
    from rose_transfer.serve import upstream_link

    monkeypatch.setattr(upstream_link, "DEFAULT_MAX_MESSAGE_BYTES", 12 * 1024)  # < the 16 KiB buckets
    state = random_state_dict(scale=20)
    announce = sparse.publish(0, 0, state)
    with Relay(secret=SECRET, upstream=sparse.source) as relay:
        fetched = asyncio.run(
            WeightFetcher(SECRET, "late", timeout=5.0).fetch(announce, -1, tmp_path / "w.bin", relay=relay.source)
        )
        assert relay.upstream_bytes >= announce.total_bytes  # it came through the relay, not the fallback
    assert_same(load_arrays(fetched), state)
