"""``DensePublisher``: the ``rose.weight_publishers`` entry ``dense``. Serves whole weight versions.

The controller is synchronous, so the TCP server runs on its own event-loop thread; ``publish`` copies
the tensors into a flat stream (in the caller's thread; the stream is a retired version's buffer
from the publisher's ``BufferPool`` once one is free), registers it, and returns the announcement.
The newest ``keep_versions`` versions stay fetchable. ``SparsePublisher`` is this class with ``sparse``
set: one constructor for both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from rose_core.protocol.auth import MIN_SECRET_BYTES, POLY1305
from rose_core.protocol.engine_layout import EngineLayout
from rose_core.protocol.messages import ShardView, WeightAnnounce
from rose_core.support.errors import ConfigError, RoseError
from rose_transfer.plan.engine_layout import engine_shards, to_engine_layout
from rose_transfer.serve.bucket_patch import word_bytes
from rose_transfer.serve.cluster_relay import ClusterRelay
from rose_transfer.serve.listeners import Listeners, ServingEnd
from rose_transfer.serve.shard_intake import ShardIntake
from rose_transfer.serve.transfer_server import TransferServer
from rose_transfer.serve.version_store import VersionStore
from rose_transfer.version.buffer_pool import BufferPool
from rose_transfer.version.manifest import DEFAULT_BUCKET_BYTES, FlatVersion, flatten
from rose_transfer.wire.loop_thread import LoopThread
from rose_transfer.wire.send_gate import SendGate
from rose_transfer.wire.tcp_address import advertised_host, bind_listener, format_source
from rose_transfer.wire.ucx_transport import ucx_listen

log = logging.getLogger(__name__)


class DensePublisher(ServingEnd):
    """Implements ``rose_core.app.weight_publisher.WeightPublisher``; every byte of a version travels to every receiver.

    ``bulk_mac``: how bucket replies are signed: ``"poly1305"`` (default; a one-time-key Poly1305 tag,
    about 7x cheaper than HMAC) or ``"hmac-sha256"``. Receivers accept both; control messages are always
    HMAC-SHA256. Neither encrypts; ``tls`` does: every TCP link (this publisher's, and its relays') is TLS 1.3
    with the server key derived from the secret (``tls://`` sources; docs/transfer.md, "Threat model"). ``max_connections`` /
    ``max_unauthenticated``: connections open at once / of those, still before their handshake (more are closed
    as they arrive and counted as ``over_capacity``)."""

    sparse: ClassVar[bool] = False  # answer a receiver holding a kept version with patches against it

    def __init__(
        self,
        *,
        secret: bytes,
        host: str,
        port: int,
        keep_versions: int = 2,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        publisher_id: str = "",
        bulk_mac: str = POLY1305,
        max_connections: int = 1024,
        max_unauthenticated: int = 64,
        tls: bool = False,
    ) -> None:
        if self.sparse and keep_versions < 2:
            raise ConfigError(
                f"a sparse publisher keeps the previous version too: keep_versions >= 2, not {keep_versions}"
            )
        if len(secret) < MIN_SECRET_BYTES:
            raise ConfigError(f"the shared secret is {len(secret)} bytes; use at least {MIN_SECRET_BYTES}")
        if bucket_bytes <= 0:
            raise ConfigError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = bucket_bytes
        self._store = VersionStore(keep_versions, BufferPool())
        self._listener = bind_listener(host, port)
        self.port = int(self._listener.getsockname()[1])
        self.tls = tls
        self.source = format_source(advertised_host(host), self.port, tls=tls)
        self._host = host
        server_id = publisher_id or f"weights@{self.source}"
        self._server = TransferServer(secret, self._store, server_id, sparse=self.sparse, bulk_mac=bulk_mac,
                                      max_connections=max_connections, max_unauthenticated=max_unauthenticated,
                                      tls=tls)
        self._thread = LoopThread("rose-weight-publisher")
        self._serving = self._thread.submit(self._server.serve(self._listener))
        self._listeners = Listeners(self._thread, self._server, self._listener)
        self._secret = secret
        log.info("serving weight versions at %s", self.source)

    def publish(
        self,
        version: int,
        step: int,
        tensors: Mapping[str, Any],
        *,
        shards: Mapping[str, str] | None = None,
        layout: EngineLayout | None = None,
    ) -> WeightAnnounce:
        """Make ``version`` fetchable (whole) and return the announcement executors act on. ``shards``:
        the shard spec text of sharded tensors (the rest are replicated), for shard-aware receivers;
        ``layout``: publish the tensors as the engines hold them (``plan.engine_layout``), each annotated with how
        it splits over tensor-parallel ranks when the layout knows the attention shape (``engine_shards``)."""
        if self._closed:
            raise RoseError("this weight publisher is closed: create a new one to publish")
        if version < 0:
            raise RoseError(f"weight versions are non-negative, got {version}")
        if layout is not None:
            tensors = to_engine_layout(tensors, layout)
            if shards is None:
                shards = engine_shards({name: tuple(t.shape) for name, t in tensors.items()}, layout)
        flat = flatten(
            tensors, version=version, bucket_bytes=self.bucket_bytes, shards=shards, allocate=self._store.pool.take
        )
        return self._register(flat, step)

    def _register(self, flat: FlatVersion, step: int) -> WeightAnnounce:
        """Serve ``flat`` (a newer version than any served) and return its announcement."""
        if self._closed:
            raise RoseError("this weight publisher is closed: create a new one to publish")
        self._store.add(flat)
        version, manifest = flat.manifest.version, flat.manifest
        self._server.prepare_for(max((b.nbytes for b in manifest.buckets), default=0), word_bytes(manifest))
        log.info(
            "published weight version %d: %d bytes in %d buckets", version, manifest.total_bytes, len(manifest.buckets)
        )
        return WeightAnnounce(
            version=version,
            step=step,
            source=self.source,
            manifest_digest=manifest.digest,
            total_bytes=manifest.total_bytes,
        )

    def open_shard_intake(
        self,
        ranks: int,
        *,
        port: int = 0,
        timeout: float = 60.0,
        on_publish: Callable[[WeightAnnounce], None] | None = None,
        key: bytes | None = None,
    ) -> str:
        """Gather versions from the ``ranks`` ranks of a tensor-parallel trainer, each calling
        ``ShardPublisher.publish_shard`` with its own shards, and serve each whole version as ``publish``
        would (same layout, bytes and digest); returns the ``tcp://`` source the ranks connect to.
        ``timeout``: how long after a version's first offer every rank must have offered, and how long
        a sending rank may be silent. ``on_publish`` gets each announcement (on the publisher's thread).
        ``key``: what the ranks sign with (`rose run` gives the shared secret, which receivers, holding only
        the weights key this publisher serves with, do not have); default: this publisher's key. A ``tls``
        publisher's intake is TLS too (``tls://``)."""

        def register(flat: FlatVersion, step: int) -> WeightAnnounce:
            announce = self._register(flat, step)
            if on_publish is not None:
                on_publish(announce)
            return announce

        if key is not None and len(key) < MIN_SECRET_BYTES:
            raise ConfigError(f"the intake's key is {len(key)} bytes; use at least {MIN_SECRET_BYTES}")
        intake = ShardIntake(
            self._secret if key is None else key,
            ranks=ranks,
            publish=register,
            newest=lambda: max(self._store.versions(), default=-1),
            allocate=self._store.pool.take,
            bucket_bytes=self.bucket_bytes,
            timeout=timeout,
            tls=self.tls,
        )
        listener = bind_listener(self._host, port)
        self._listeners.tcp.append(listener)
        self._thread.submit(intake.serve(listener))
        return format_source(advertised_host(self._host), int(listener.getsockname()[1]), tls=self.tls)

    def start_relay(self, relay_id: str, *, transport: str = "tcp") -> ClusterRelay:
        """A relay of this publisher on this host (a remote cluster's, modelled here): receivers there
        pull through its ``source``; ``transport``: ``tcp`` or ``ucx``. The caller closes it."""
        return ClusterRelay(
            secret=self._secret, upstream=self.source, host=self._host, relay_id=relay_id, transport=transport
        )

    def open_tcp(self, port: int = 0, *, gate: SendGate | None = None) -> str:
        """Serve the same versions on another TCP port (0 picks one), its sends admitted by ``gate`` if
        given; returns that port's ``tcp://`` source."""
        listener = bind_listener(self._host, port)
        self._listeners.tcp.append(listener)
        self._thread.submit(self._server.serve(listener, gate))
        return format_source(advertised_host(self._host), int(listener.getsockname()[1]), tls=self.tls)

    def open_ucx(self, *, gate: SendGate | None = None) -> str:
        """Serve the same versions over UCX too (needs the ``[ucx]`` extra), its sends admitted by
        ``gate`` if given; returns its ``ucx://`` source."""

        async def start() -> str:
            listener, source = ucx_listen(self._server.handle_connection, advertised_host(self._host), 0, gate)
            self._listeners.ucx.append(listener)
            return source

        return self._thread.submit(start()).result()

    def stream(self, version: int, view: ShardView | None = None) -> Any:
        """The flat bytes (uint8) of a version still served, or None; as ``view`` holds it, a copy
        cut for the caller (a publisher keeps no stream per view)."""
        served = self._store.get(version)
        return None if served is None else served.view(view).stream(self._store.pool.take)

    def versions(self) -> list[int]:
        """The versions currently fetchable, oldest first."""
        return self._store.versions()

    @property
    def rejected(self) -> int:
        """Connections dropped for a rejected frame since start."""
        return self._server.rejected
