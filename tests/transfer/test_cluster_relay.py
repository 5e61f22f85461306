"""A publisher's relay for one cluster (``start_relay``): receivers pull through it over TCP or UCX, each
version crosses the link to it once, and patches stay patches through it."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from rose_core.support.errors import ConfigError
from rose_transfer import ResidentWeights, WeightFetcher
from rose_transfer.serve.sparse_publisher import SparsePublisher

from .conftest import SECRET, assert_same, random_state_dict

TRANSPORTS = ["tcp", pytest.param("ucx", marks=pytest.mark.skipif(
    importlib.util.find_spec("ucxx") is None, reason="the [ucx] extra of rose-transfer"))]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_two_receivers_through_a_cluster_relay_cost_the_link_one_copy(transport: str) -> None:
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0) as publisher:
        relay = publisher.start_relay("relay-remote", transport=transport)
        try:
            assert relay.source.startswith(f"{transport}://")
            targets = [ResidentWeights(), ResidentWeights()]
            fetchers = [WeightFetcher(SECRET, f"r{i}") for i in range(2)]
            v0 = random_state_dict(scale=20)

            async def both(announce) -> None:  # type: ignore[no-untyped-def]
                await asyncio.gather(*(f.fetch_into(announce, t, relay=relay.source)
                                       for f, t in zip(fetchers, targets, strict=True)))

            announce = publisher.publish(0, 0, v0)
            asyncio.run(both(announce))
            first = relay.upstream_bytes
            assert announce.total_bytes <= first < 1.5 * announce.total_bytes  # once, not twice
            v1 = {k: v.copy() for k, v in v0.items()}
            name = next(iter(v1))
            v1[name].reshape(-1)[:10] += 1
            asyncio.run(both(publisher.publish(1, 1, v1)))
            assert relay.upstream_bytes - first < announce.total_bytes // 10  # patches, once
            for target in targets:
                assert_same(target.arrays(), v1)
        finally:
            relay.close()


def test_an_unknown_transport_is_refused() -> None:
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0) as publisher, \
            pytest.raises(ConfigError, match="tcp or ucx, not 'rdma'"):
        publisher.start_relay("r", transport="rdma")
