"""How the controller hands a new weight version to the data plane, without importing it.

rose-core must not depend on rose-transfer (dependencies point core <- transfer), so the controller
finds the publisher through the entry-point group ``rose.weight_publishers``; rose-transfer registers
``dense`` (and later others) there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol

from rose_core.protocol.engine_layout import EngineLayout
from rose_core.protocol.messages import WeightAnnounce
from rose_core.support.errors import MissingExtraError, RoseError

ENTRY_POINT_GROUP = "rose.weight_publishers"


class WeightRelay(Protocol):
    """A relay in a remote cluster: receivers there pull through ``source``; each version crosses the link
    to it once (``upstream_bytes`` counts what crossed)."""

    @property
    def source(self) -> str: ...

    @property
    def upstream_bytes(self) -> int: ...

    def close(self) -> None: ...


class WeightPublisher(Protocol):
    """Serves weight versions to receivers that pull them."""

    source: str
    """Where receivers and relays reach it (``tcp://host:port``, or ``tls://host:port``)."""

    def start_relay(self, relay_id: str, *, transport: str = "tcp") -> WeightRelay:
        """Start a relay of this publisher (receivers reach it over ``transport``: ``tcp`` or ``ucx``)."""
        ...

    def publish(
        self, version: int, step: int, tensors: Mapping[str, Any], *, layout: EngineLayout | None = None
    ) -> WeightAnnounce:
        """Make ``version`` fetchable (whole) and return the announcement executors act on; ``tensors``
        carry checkpoint names, ``layout`` says how the engines hold them (default: as given)."""
        ...

    def open_shard_intake(self, ranks: int, *, port: int = 0, timeout: float = 60.0,
                          on_publish: Callable[[WeightAnnounce], None] | None = None,
                          key: bytes | None = None) -> str:
        """Accept versions from the ``ranks`` ranks of a trainer outside ROSE, each publishing its own shard
        (``rose_transfer.ShardPublisher``); returns the ``tcp://`` source they connect to. ``on_publish``
        gets each announcement once every rank's part is in. ``key``: what the ranks sign with (the shared
        secret, which receivers do not hold; default: the publisher's own key)."""
        ...

    def close(self) -> None: ...


class PublisherFactory(Protocol):
    def __call__(self, *, secret: bytes, host: str, port: int, tls: bool = False) -> WeightPublisher: ...


def load_publisher(name: str, *, secret: bytes, host: str, port: int, tls: bool = False) -> WeightPublisher:
    """The publisher registered as ``name``; ``tls``: it (and its relays) serve TLS (``tls://`` sources)."""
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if not found:
        raise MissingExtraError("rose-transfer (the weight data plane)", "rose-transfer")
    if name not in found:
        raise RoseError(f"unknown weight publisher {name!r}: choose one of {sorted(found)}")
    factory: PublisherFactory = found[name].load()
    return factory(secret=secret, host=host, port=port, tls=tls)
