"""The publisher's side of the weight channel: an asyncio TCP server answering pulls for buckets.

Per connection: ``Hello(kind="weights")`` -> ``Welcome``, then any number of ``FetchManifest`` /
``FetchBucket`` requests, answered in order with ``WeightManifest`` / ``BucketData`` / ``ErrorReport``.
A reader task reads requests ahead while a writer task sends replies (signed on worker threads, cached
per version), so a receiver that keeps several requests in flight is never idle on a round trip. A
rejected frame (bad signature, garbage, oversized, no handshake) drops that connection only: it is
logged, counted in ``rose_rejected_messages_total`` and the server keeps serving everyone else.
Requests are checked for replays as the control plane checks messages (``rose_core.protocol.replay_guard``, one guard
for all of this server's connections): a captured request played again, on its connection or another, is
rejected as ``replay``. (Every receiver seals a connection's requests with a framer of its own.)

With ``tls`` every TCP connection is TLS 1.3 (``wire.tls_link``: the server key derived from the secret,
pinned by receivers); UCX connections are not encrypted.

Connections are capped before anything is read from them: at most ``max_connections`` open and, of those,
at most ``max_unauthenticated`` still before their handshake (each has ``handshake_timeout`` to send it). A
connection over either cap is closed as it arrives and counted (``reason="over_capacity"``), so a peer
without the secret can hold at most ``max_unauthenticated`` slots for ``handshake_timeout`` each, and never
the slots of receivers already connected.

A ``sparse`` server answers ``FetchBucket(have_version=v)`` for a version it still keeps with a patch
against ``v`` (``bucket_patch``; encoded and signed once per (bucket, base, view) on a worker thread,
shared by every receiver and relay asking for it), and anything else dense. Each listener may have a
``SendGate`` that admits its connections' sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

import msgspec

from rose_core.protocol.auth import POLY1305, Signer, check_mac_scheme
from rose_core.protocol.messages import (
    BucketData,
    ErrorReport,
    FetchBucket,
    FetchManifest,
    Hello,
    ShardView,
    TransferRequest,
    WeightManifest,
    Welcome,
)
from rose_core.protocol.replay_guard import ReplayGuard
from rose_core.protocol.wire import Framer
from rose_core.support.errors import ProtocolError, RoseError
from rose_core.support.metrics import REJECTED_MESSAGES
from rose_transfer.codec.compiled_scan import warm_up
from rose_transfer.metrics import SENT_BYTES
from rose_transfer.serve.bucket_patch import dense_reply, patch_reply, prepare_thread, same_buckets
from rose_transfer.serve.version_store import ServedVersion, VersionStore
from rose_transfer.wire.accept_loop import accept_forever
from rose_transfer.wire.frame_connection import FrameConnection
from rose_transfer.wire.frame_socket import FrameSocket
from rose_transfer.wire.sealer import Sealer
from rose_transfer.wire.send_gate import SendGate
from rose_transfer.wire.tls_link import TlsFrameSocket

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 64 * 1024
_NOTIFIED_REASONS = ("unauthenticated", "wrong_version", "no_handshake", "needs_tls")


class TransferServer:
    def __init__(
        self,
        secret: bytes,
        store: VersionStore,
        server_id: str,
        *,
        handshake_timeout: float = 10.0,
        idle_timeout: float = 600.0,
        read_ahead: int = 8,
        sparse: bool = False,
        bulk_mac: str = POLY1305,
        max_connections: int = 1024,
        max_unauthenticated: int = 64,
        tls: bool = False,
    ) -> None:
        self._secret = secret
        self.tls = tls
        self._max_connections = max_connections
        self._max_unauthenticated = max_unauthenticated
        self._open = 0
        self._unauthenticated = 0
        self._store = store
        self.server_id = server_id
        self._handshake_timeout = handshake_timeout
        self._idle_timeout = idle_timeout
        self._read_ahead = read_ahead
        self.sparse = sparse
        self._sealer = Sealer(secret, bulk_mac=check_mac_scheme(bulk_mac))
        # the patch encoder's kernels compile (or load from disk) now, not in the first pull of a patch
        self.warmed: list[Future[None]] = self._sealer.on_every_worker(warm_up) if sparse else []
        self._prepared_bytes = 0
        self.rejected = 0
        self.connections = 0
        self._replays = ReplayGuard()
        self._connection_ids = itertools.count()

    def close(self) -> None:
        self._sealer.close()

    def prepare_for(self, bucket_bytes: int, word_bytes: int) -> None:
        """A version with buckets of up to ``bucket_bytes`` is served: ready every sealing thread to encode
        them (scan buffers and scratch sized and faulted in, in the background), so the first pull of the
        next version pays for none of it. Nothing to do for a dense server or sizes already prepared."""
        if not self.sparse or bucket_bytes <= self._prepared_bytes:
            return
        self._prepared_bytes = bucket_bytes
        self.warmed = self._sealer.on_every_worker(partial(prepare_thread, bucket_bytes, word_bytes))

    # ---------------------------------------------------------------- accept

    async def serve(self, listener: socket.socket, gate: SendGate | None = None) -> None:
        """Accept and serve connections on ``listener``; ``gate``, if given, admits their sends."""

        def accepted(sock: socket.socket, address: Any) -> Coroutine[Any, Any, None]:
            self.connections += 1
            return self._handle(sock, _peer_name(address), gate)

        await accept_forever(listener, accepted, "weight server")

    async def _handle(self, sock: socket.socket, peer: str, gate: SendGate | None = None) -> None:
        """A TCP connection; with ``tls``, its TLS handshake runs in the connection's handshake (same timeout,
        same count of connections before their handshake)."""
        conn = TlsFrameSocket.server(sock, self._secret, gate) if self.tls else FrameSocket(sock, gate=gate)
        await self.handle_connection(conn, peer)

    async def handle_connection(self, conn: FrameConnection, peer: str) -> None:
        """Serve one accepted connection (a ``FrameSocket`` or a ``UcxFrameSocket``) until it ends."""
        if self._open >= self._max_connections or self._unauthenticated >= self._max_unauthenticated:
            self._over_capacity(peer)
            conn.close()
            return
        framer = _RequestOpener(Signer(self._secret), self._replays, next(self._connection_ids))
        self._open += 1
        self._unauthenticated += 1
        handshaking = True
        try:
            accepted = await self._handshake(conn, framer, peer)
            self._unauthenticated, handshaking = self._unauthenticated - 1, False
            if accepted:
                await self._serve(conn, framer)
        except ProtocolError as exc:
            await self._reject(conn, framer, peer, exc)
        except (OSError, TimeoutError) as exc:
            log.debug("weight connection from %s ended: %s", peer, exc)
        finally:
            self._open -= 1
            if handshaking:
                self._unauthenticated -= 1
            conn.close()

    async def _handshake(self, conn: FrameConnection, framer: _RequestOpener, peer: str) -> bool:
        frames = await asyncio.wait_for(conn.recv(MAX_REQUEST_BYTES), self._handshake_timeout)
        hello = framer.open(frames)
        if not isinstance(hello, Hello):
            raise ProtocolError("no_handshake", f"first message is {type(hello).__name__}, not hello")
        if hello.kind != "weights":
            message = f"this is a weight publisher, not a controller: point {hello.kind} peers at the controller"
            await conn.send(self._sealer.seal(ErrorReport(code="wrong_peer_kind", message=message)))
            return False
        log.debug("weight receiver %s connected from %s", hello.peer_id, peer)
        await conn.send(self._sealer.seal(Welcome(controller_id=self.server_id)))
        return True

    def _over_capacity(self, peer: str) -> None:
        self.rejected += 1
        REJECTED_MESSAGES.labels("over_capacity").inc()
        if self.rejected <= 20 or self.rejected % 1000 == 0:
            log.warning("refused a weight connection from %s: %d open (limit %d), %d before their handshake "
                        "(limit %d)", peer, self._open, self._max_connections, self._unauthenticated,
                        self._max_unauthenticated)

    async def _reject(self, conn: FrameConnection, framer: Framer, peer: str, exc: ProtocolError) -> None:
        self.rejected += 1
        REJECTED_MESSAGES.labels(exc.reason).inc()
        if self.rejected <= 20 or self.rejected % 1000 == 0:
            log.warning("dropped weight connection from %s (%s): %s", peer, exc.reason, exc)
        if exc.reason in _NOTIFIED_REASONS:
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(conn.send(framer.notice(exc.reason, str(exc))), 1.0)

    # ---------------------------------------------------------------- requests

    async def _serve(self, conn: FrameConnection, framer: _RequestOpener) -> None:
        replies: asyncio.Queue[asyncio.Future[list[Any]]] = asyncio.Queue(self._read_ahead)
        tasks = {
            asyncio.create_task(self._read_requests(conn, framer, replies)),
            asyncio.create_task(self._write_replies(conn, replies)),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            task.result()

    async def _read_requests(
        self, conn: FrameConnection, framer: _RequestOpener, replies: asyncio.Queue[asyncio.Future[list[Any]]]
    ) -> None:
        while True:
            frames = await asyncio.wait_for(conn.recv(MAX_REQUEST_BYTES), self._idle_timeout)
            request = framer.open(frames)
            if isinstance(request, ErrorReport):  # a peer's notice: logged, never answered
                log.info("weight receiver reports %s: %s", request.code, request.message)
                continue
            await replies.put(self._reply(request))

    async def _write_replies(self, conn: FrameConnection, replies: asyncio.Queue[asyncio.Future[list[Any]]]) -> None:
        while True:
            frames = await asyncio.shield(await replies.get())  # shared with other connections
            await conn.send(frames)
            SENT_BYTES.inc(sum(memoryview(f).nbytes for f in frames))

    def _reply(self, request: Any) -> asyncio.Future[list[Any]]:
        if isinstance(request, Hello):
            return self._now(Welcome(controller_id=self.server_id))
        served = self._store.get(request.version)
        if served is None:
            return self._now(self._unknown_version(request.version))
        if isinstance(request, FetchManifest):
            view = request.view
            return self._cached(served, ("manifest", view), lambda: self._manifest_reply(served, view))
        if isinstance(request, FetchBucket) and 0 <= request.index < len(served.flat.manifest.buckets):
            base, index, view = self._base(served, request.have_version), request.index, request.view
            key = (index, None if base is None else base.version, view)
            return self._cached(served, key, lambda: self._bucket_reply(served, base, index, view))
        message = f"version {request.version} has no bucket {request.index}: the receiver's manifest is stale"
        return self._now(ErrorReport(code="bad_request", message=message))

    def _now(self, msg: msgspec.Struct) -> asyncio.Future[list[Any]]:
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        future.set_result(self._sealer.seal(msg))
        return future

    def _base(self, served: ServedVersion, have_version: int) -> ServedVersion | None:
        """The version to patch against: the receiver's, when this server is sparse and still holds it."""
        if not self.sparse or have_version < 0 or have_version == served.version:
            return None
        return self._store.get(have_version)

    def _cached(self, served: ServedVersion, key: Any, make: Callable[[], msgspec.Struct]) -> asyncio.Future[list[Any]]:
        """Sealed frames of ``make()`` (built and signed on a worker thread once per version and key)."""
        future = served.sealed.get(key)
        if future is None or _failed(future):
            loop = asyncio.get_running_loop()
            future = served.sealed[key] = loop.run_in_executor(self._sealer.pool, lambda: self._sealer.seal(make()))
        return future

    @staticmethod
    def _manifest_reply(served: ServedVersion, view: ShardView | None) -> WeightManifest | ErrorReport:
        try:
            return served.view(view).manifest
        except RoseError as exc:
            return _unservable(served, view, exc)

    def _bucket_reply(
        self, served: ServedVersion, base: ServedVersion | None, index: int, view: ShardView | None
    ) -> BucketData | ErrorReport:
        """Bucket ``index`` of ``served`` (as ``view`` holds it): a patch against ``base`` where the
        two are cut alike, else dense. Runs on a worker thread (a view is described on first use)."""
        try:
            new = served.view(view)
            old = None if base is None else base.view(view)
        except RoseError as exc:
            return _unservable(served, view, exc)
        if index >= len(new.manifest.buckets):
            message = f"version {served.version} as {view} has no bucket {index}: the receiver's manifest is stale"
            return ErrorReport(code="bad_request", message=message)
        if old is not None and same_buckets(old.manifest, new.manifest):
            return patch_reply(old, new, index, self._store.pool.take)
        return dense_reply(new, index, self._store.pool.take)

    def _unknown_version(self, version: int) -> ErrorReport:
        kept = self._store.versions()
        message = (
            f"weight version {version} is not served here (the publisher keeps versions {kept}): "
            "fetch the version of the newest announce"
        )
        return ErrorReport(code="unknown_version", message=message, ref=str(version))


def _unservable(served: ServedVersion, view: ShardView | None, exc: RoseError) -> ErrorReport:
    """The refusal of a view this version cannot be cut into (a degree that does not divide it, ...)."""
    where = "" if view is None else f" as rank {view.rank} of tensor-parallel degree {view.tp}"
    return ErrorReport(code="bad_request", message=f"cannot serve weight version {served.version}{where}: {exc}")


def _peer_name(address: Any) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


def _failed(future: asyncio.Future[Any]) -> bool:
    return future.done() and (future.cancelled() or future.exception() is not None)


class _RequestOpener(Framer):
    """Opens one connection's requests and checks each for replay against the server's guard."""

    def __init__(self, signer: Signer, replays: ReplayGuard, connection: int) -> None:
        super().__init__(signer, TransferRequest, MAX_REQUEST_BYTES)
        self._replays = replays
        self._connection = connection.to_bytes(8, "big")

    def open(self, frames: Sequence[Any]) -> Any:
        msg, _, stamp = self.open_keyed(frames)
        if stamp is not None:  # None: an unsigned notice, logged and never answered
            self._replays.check(self._connection, stamp, time.time())
        return msg
