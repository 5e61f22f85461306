"""ZMQ transport of the control plane: a bound ROUTER (controller) and connected DEALERs (peers).

Socket I/O runs on one thread per endpoint (ZMQ sockets are single-threaded); callers send from any
thread through an inproc pipe and receive decoded messages from a queue or a callback. Every rejected
frame is logged, counted in ``rose_rejected_messages_total{reason}`` and dropped; the endpoint and its
other peers keep working.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from rose_core.auth import Signer
from rose_core.errors import ProtocolError, RoseError
from rose_core.messages import FromController, ToController
from rose_core.metrics import REJECTED_MESSAGES
from rose_core.wire import DEFAULT_MAX_MESSAGE_BYTES, Framer

log = logging.getLogger(__name__)
Callback = Callable[[bytes, Any], None]
_ids = itertools.count()


class _Endpoint:
    """Shared machinery of both ends: the I/O thread, the outbound pipe, rejection handling."""

    def __init__(
        self,
        sock_type: int,
        secret: bytes,
        decode_type: Any,
        on_message: Callback | None,
        max_message_bytes: int,
    ) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(sock_type)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._signer = Signer(secret)
        self._decode_type = decode_type
        self._max = max_message_bytes
        self._send_framer = Framer(self._signer, decode_type, max_message_bytes)
        self._inbox: queue.Queue[tuple[bytes, Any]] = queue.Queue()
        self._on_message = on_message
        self._pipe_addr = f"inproc://rose-out-{next(_ids)}"
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(self._pipe_addr)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(self._pipe_addr)
        self._push_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notified: set[tuple[bytes, str]] = set()
        self._queued = 0
        self._forwarded = 0
        self.rejected = 0

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()

    def close(self, flush_s: float = 0.5) -> None:
        """Stop; messages sent before this call get up to ``flush_s`` seconds to leave."""
        deadline = time.monotonic() + flush_s
        while self._thread is not None and self._forwarded < self._queued and time.monotonic() < deadline:
            time.sleep(0.005)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._push_lock:
            self._push.close(0)
        self._pull.close(0)
        self._sock.close(linger=int(max(0.0, deadline - time.monotonic()) * 1000))
        self._ctx.term()

    def __enter__(self) -> _Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- receive side

    def recv(self, timeout: float | None = None) -> tuple[bytes, Any] | None:
        """The next ``(peer, message)``, or ``None`` after ``timeout`` seconds."""
        try:
            return self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def _deliver(self, peer: bytes, msg: Any) -> None:
        if self._on_message is not None:
            self._on_message(peer, msg)
        else:
            self._inbox.put((peer, msg))

    # ---------------------------------------------------------------- the I/O thread

    def _run(self) -> None:
        framer = Framer(self._signer, self._decode_type, self._max)
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            events = dict(poller.poll(50))
            if self._pull in events:
                self._flush_outbound()
            if self._sock in events:
                self._drain_inbound(framer)

    def _flush_outbound(self) -> None:
        for _ in range(1024):
            try:
                frames = self._pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self._sock.send_multipart(frames, copy=False)
            except zmq.ZMQError as exc:
                log.debug("dropped an outgoing message: %s", exc)
            finally:
                self._forwarded += 1

    def _drain_inbound(self, framer: Framer) -> None:
        for _ in range(1024):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            peer, body = self._split(frames)
            try:
                msg = framer.open([f.buffer for f in body])
            except ProtocolError as exc:
                self._reject(peer, exc, framer)
                continue
            self._deliver(peer, msg)

    def _reject(self, peer: bytes, exc: ProtocolError, framer: Framer) -> None:
        self.rejected += 1
        REJECTED_MESSAGES.labels(exc.reason).inc()
        if self.rejected <= 20 or self.rejected % 1000 == 0:
            log.warning("rejected a message from %r (%s): %s", peer[:32], exc.reason, exc)
        if exc.reason in ("unauthenticated", "wrong_version") and (peer, exc.reason) not in self._notified:
            self._notified.add((peer, exc.reason))
            self._send_raw(peer, framer.notice(exc.reason, str(exc)))

    def _send_raw(self, peer: bytes, frames: list[Any]) -> None:
        try:
            self._sock.send_multipart(self._route(peer, frames), copy=False)
        except zmq.ZMQError as exc:
            log.debug("could not notify %r: %s", peer, exc)

    def _send(self, peer: bytes, msg: msgspec.Struct) -> None:
        with self._push_lock:
            frames = self._route(peer, self._send_framer.seal(msg))
            self._push.send_multipart(frames, copy=False)
            self._queued += 1

    # ---------------------------------------------------------------- per socket type

    def _split(self, frames: list[Any]) -> tuple[bytes, list[Any]]:
        raise NotImplementedError

    def _route(self, peer: bytes, frames: list[Any]) -> list[Any]:
        raise NotImplementedError


class ControlServer(_Endpoint):
    """The controller's bound ROUTER socket. Peers are identified by their routing id."""

    def __init__(
        self,
        address: str,
        secret: bytes,
        on_message: Callback | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        super().__init__(zmq.ROUTER, secret, ToController, on_message, max_message_bytes)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as exc:
            self.close()
            raise RoseError(
                f"cannot listen on {address} ({exc.strerror}): pick a free port with --port or stop the other controller"
            ) from exc
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.start()

    def send(self, peer: bytes, msg: msgspec.Struct) -> None:
        self._send(peer, msg)

    def _split(self, frames: list[Any]) -> tuple[bytes, list[Any]]:
        return bytes(frames[0].buffer), frames[1:]

    def _route(self, peer: bytes, frames: list[Any]) -> list[Any]:
        return [peer, *frames]


class ControlClient(_Endpoint):
    """A peer's DEALER socket connected to the controller."""

    def __init__(
        self,
        address: str,
        secret: bytes,
        peer_id: str,
        on_message: Callback | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        super().__init__(zmq.DEALER, secret, FromController, on_message, max_message_bytes)
        self._sock.setsockopt(zmq.ROUTING_ID, peer_id.encode())
        try:
            self._sock.connect(address)
        except zmq.ZMQError as exc:
            self.close()
            raise RoseError(f"bad controller address {address!r} ({exc.strerror}): use tcp://HOST:PORT") from exc
        self.start()

    def send(self, msg: msgspec.Struct) -> None:
        self._send(b"", msg)

    def _split(self, frames: list[Any]) -> tuple[bytes, list[Any]]:
        return b"controller", list(frames)

    def _route(self, peer: bytes, frames: list[Any]) -> list[Any]:
        return frames
