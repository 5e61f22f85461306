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

    from rose_core.messages import ShardView
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
