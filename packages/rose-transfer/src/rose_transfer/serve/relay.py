"""``Relay``: a weight server inside a destination cluster that pulls each needed byte over the slow
link once and serves the receivers of its cluster over fast links.

It answers the same protocol as a publisher. A request it has not seen is forwarded upstream (the
receiver's ``have_version`` included, so patches stay patches); the publisher's sealed reply is
cached and sent to every receiver that asks the same, so concurrent receivers share one upstream
pull per (version, bucket, base). Pipelined: receivers keep several buckets in flight, so the relay
serves bucket i while bucket i+1 is on the slow link. If the relay dies, receivers fall back to the
publisher (``WeightFetcher.fetch(..., relay=...)``). Only the two newest versions stay cached.
``open_ucx()`` serves the same cache over UCX too."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rose_core.protocol.auth import MIN_SECRET_BYTES
from rose_core.protocol.messages import FetchBucket, FetchManifest, Hello, Welcome
from rose_core.support.errors import ConfigError
from rose_transfer.serve.listeners import Listeners, ServingEnd
from rose_transfer.serve.transfer_server import TransferServer
from rose_transfer.serve.upstream_link import UpstreamLink
from rose_transfer.serve.version_store import VersionStore
from rose_transfer.wire.loop_thread import LoopThread
from rose_transfer.wire.tcp_address import advertised_host, bind_listener, format_source, is_tls
from rose_transfer.wire.ucx_transport import ucx_listen

log = logging.getLogger(__name__)
_KEEP_VERSIONS = 2


class RelayServer(TransferServer):
    def __init__(self, secret: bytes, upstream: UpstreamLink, server_id: str, *, tls: bool = False) -> None:
        super().__init__(secret, VersionStore(), server_id, tls=tls)
        self.upstream = upstream
        self._cache: dict[tuple[Any, ...], asyncio.Future[list[Any]]] = {}

    def _reply(self, request: Any) -> asyncio.Future[list[Any]]:
        if isinstance(request, Hello):
            return self._now(Welcome(controller_id=self.server_id))
        if isinstance(request, FetchManifest):
            key: tuple[Any, ...] = (request.version, "manifest", request.view)
            upstream: FetchManifest | FetchBucket = FetchManifest(
                version=request.version, receiver_id=self.server_id, view=request.view
            )
        elif isinstance(request, FetchBucket):
            key = (request.version, request.index, request.have_version, request.view)
            upstream = FetchBucket(
                version=request.version,
                index=request.index,
                have_version=request.have_version,
                receiver_id=self.server_id,
                view=request.view,
            )
        else:  # pragma: no cover - the request union has no other members
            raise TypeError(type(request).__name__)
        future = self._cache.get(key)
        if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
            future = self._cache[key] = asyncio.ensure_future(self.upstream.request(upstream))
            self._evict(request.version)
        return future

    def _evict(self, newest: int) -> None:
        versions = sorted({key[0] for key in self._cache})
        for old in versions[:-_KEEP_VERSIONS]:
            for key in [k for k in self._cache if k[0] == old]:
                del self._cache[key]


class Relay(ServingEnd):
    """A relay on its own event-loop thread, serving at ``self.source``. ``tls``: serve TLS (``tls://``);
    ``None``: as its upstream does (a relay of a ``tls://`` publisher keeps the weights encrypted)."""

    def __init__(
        self,
        *,
        secret: bytes,
        upstream: str,
        host: str = "127.0.0.1",
        port: int = 0,
        relay_id: str = "",
        tls: bool | None = None,
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ConfigError(f"the shared secret is {len(secret)} bytes; use at least {MIN_SECRET_BYTES}")
        self.tls = is_tls(upstream) if tls is None else tls
        self._listener = bind_listener(host, port)
        self._host = host
        self.source = format_source(advertised_host(host), int(self._listener.getsockname()[1]), tls=self.tls)
        self.relay_id = relay_id or f"relay@{self.source}"
        self._thread = LoopThread(f"rose-relay-{self.source}")
        self._upstream = self._thread.submit(_make_link(secret, upstream, self.relay_id)).result()
        self._server = RelayServer(secret, self._upstream, self.relay_id, tls=self.tls)
        self._listeners = Listeners(self._thread, self._server, self._listener)
        self._thread.submit(self._server.serve(self._listener))
        log.info("relaying %s at %s", upstream, self.source)

    @property
    def upstream_bytes(self) -> int:
        """Bytes received from the publisher so far (what crossed the slow link to this relay)."""
        return self._upstream.bytes_received

    def open_ucx(self, port: int = 0) -> str:
        """Serve receivers over UCX too (needs the ``[ucx]`` extra), on ``port`` (0: a free one); returns its
        ``ucx://`` source."""

        async def start() -> str:
            listener, source = ucx_listen(self._server.handle_connection, advertised_host(self._host), port)
            self._listeners.ucx.append(listener)
            return source

        return self._thread.submit(start()).result()


async def _make_link(secret: bytes, upstream: str, relay_id: str) -> UpstreamLink:
    return UpstreamLink(secret, upstream, relay_id)
