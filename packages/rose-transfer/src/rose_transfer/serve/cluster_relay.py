"""``ClusterRelay``: a relay started for one cluster of receivers, with the address they should pull from
(its TCP source, or its UCX one when the cluster's link is UCX). Implements ``rose_core.app.weight_publisher.WeightRelay``."""

from __future__ import annotations

from rose_core.support.errors import ConfigError
from rose_transfer.serve.relay import Relay


class ClusterRelay:
    def __init__(self, *, secret: bytes, upstream: str, host: str, relay_id: str, transport: str = "tcp") -> None:
        if transport not in ("tcp", "ucx"):
            raise ConfigError(f"relay {relay_id}: transport is tcp or ucx, not {transport!r}")
        self.relay = Relay(secret=secret, upstream=upstream, host=host, relay_id=relay_id)
        try:
            self._source = self.relay.open_ucx() if transport == "ucx" else self.relay.source
        except BaseException:
            self.relay.close()
            raise

    @property
    def source(self) -> str:
        return self._source

    @property
    def upstream_bytes(self) -> int:
        return self.relay.upstream_bytes

    def close(self) -> None:
        self.relay.close()
