"""The UCX transport: the same weight channel over ucxx (TCP underneath here)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

pytest.importorskip("ucxx")

from rose_transfer import WeightFetcher, load_arrays
from rose_transfer.serve.sparse_publisher import SparsePublisher

from .conftest import SECRET, assert_same, random_state_dict

os.environ.setdefault("UCX_TLS", "tcp,self")
os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


def test_fetch_over_ucx_is_bit_exact(tmp_path: Path) -> None:
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=16 * 1024) as pub:
        source = pub.open_ucx()
        assert source.startswith("ucx://")
        state = random_state_dict(scale=20)
        announce = pub.publish(0, 0, state)
        ucx_announce = type(announce)(
            **{**{f: getattr(announce, f) for f in announce.__struct_fields__}, "source": source}
        )
        fetched = asyncio.run(WeightFetcher(SECRET, "r0", timeout=10.0).fetch(ucx_announce, -1, tmp_path / "v0.bin"))
        assert_same(load_arrays(fetched), state)


def test_views_through_a_relay_over_ucx_never_fall_back() -> None:
    """Two shard views through one relay ask the publisher different things at once over one UCX
    link: each message must go out whole (they used to interleave and the link broke)."""
    import msgspec

    from rose_core.protocol.messages import ShardView
    from rose_transfer import ResidentWeights
    from rose_transfer.serve.relay import Relay

    from .test_shard_views import SHARDS, _slices, _state

    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=8 * 1024) as pub:
        state = _state(4)
        announce = msgspec.structs.replace(pub.publish(0, 0, state, shards=SHARDS), source="tcp://127.0.0.1:9")
        with Relay(secret=SECRET, upstream=pub.open_ucx()) as relay:  # no fallback: the source is dead

            async def both() -> list[ResidentWeights]:
                targets = [ResidentWeights(), ResidentWeights()]
                await asyncio.gather(
                    *(
                        WeightFetcher(SECRET, f"r{rank}", timeout=10.0, max_reconnects=0).fetch_into(
                            announce, target, relay=relay.source, view=ShardView(tp=2, rank=rank)
                        )
                        for rank, target in enumerate(targets)
                    )
                )
                return targets

            for rank, target in enumerate(asyncio.run(both())):
                assert_same(target.arrays(), _slices(state, 2, rank))


def _closed_ucx_relay(upstream: str) -> str:
    """The ``ucx://`` address of a relay that served there and was closed: nothing listens now."""
    from rose_transfer.serve.relay import Relay

    relay = Relay(secret=SECRET, upstream=upstream)
    address = relay.open_ucx()
    relay.close()
    return address


@pytest.mark.parametrize("dead", ["closed", "unresolvable"])
def test_a_dead_ucx_relay_falls_back_to_the_source(dead: str, tmp_path: Path) -> None:
    """A UCX connect to a dead relay raises ucxx's own exceptions (``UCXXNotConnectedError``,
    ``UCXXError``, ...), not OSError; the fetcher must still fall back to the source, bit-exact."""
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=16 * 1024) as pub:
        state = random_state_dict(scale=20)
        announce = pub.publish(0, 0, state)
        relay = _closed_ucx_relay(pub.source) if dead == "closed" else "ucx://dead-relay.invalid:4000"
        fetcher = WeightFetcher(SECRET, "r0", timeout=2.0, relay_reconnects=2)
        fetched = asyncio.run(fetcher.fetch(announce, -1, tmp_path / "v0.bin", relay=relay))
        assert_same(load_arrays(fetched), state)


def test_a_ucx_relay_dying_mid_version_falls_back_bit_exact(tmp_path: Path) -> None:
    """``test_relay_dying_mid_transfer_falls_back_bit_exact`` with the receivers on UCX: the relay
    is closed once a quarter of the version crossed into it; both receivers reconnect, fail, and
    finish from the source."""
    import threading

    from rose_transfer.serve.relay import Relay

    from .test_sparse_relay import _slow_link

    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=16 * 1024) as pub:
        state = random_state_dict(scale=40)
        announce = pub.publish(0, 0, state)
        relay = Relay(secret=SECRET, upstream=_slow_link(pub, 8))  # ~1 MB/s into the relay's cluster
        relay_source = relay.open_ucx()

        fetched_all = threading.Event()
        killed = threading.Event()

        def kill_after_a_quarter() -> None:  # by bytes, not time: a loaded machine delays timers
            while relay.upstream_bytes < announce.total_bytes // 4:
                if fetched_all.wait(0.005):
                    return
            relay.close()
            killed.set()

        killer = threading.Thread(target=kill_after_a_quarter, daemon=True)
        killer.start()
        fetchers = [WeightFetcher(SECRET, f"r{i}", timeout=2.0) for i in range(2)]

        async def both():  # type: ignore[no-untyped-def]
            return await asyncio.gather(
                *(f.fetch(announce, -1, tmp_path / f"r{i}.bin", relay=relay_source) for i, f in enumerate(fetchers))
            )

        try:
            got = asyncio.run(both())
        finally:
            fetched_all.set()
            killer.join(10)
            relay.close()
        assert killed.is_set()
        assert relay.upstream_bytes < announce.total_bytes  # it died before finishing
        for fetched in got:
            assert_same(load_arrays(fetched), state)
