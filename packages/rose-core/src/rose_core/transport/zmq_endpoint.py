"""ZMQ transport of the control plane: the socket rules every endpoint keeps, and the threaded endpoint
(``channel``: the controller's ROUTER, a dashboard's DEALER) beside the loop-owned one (``loop_control_client``:
an executor's DEALER).

Socket I/O runs on one thread per endpoint (ZMQ sockets are single-threaded); callers send from any
thread through an inproc pipe and receive decoded messages from a queue or a callback. What arrives is
opened, and rejected when it must be, by ``rose_core.transport.inbound.Inbound`` (shared with the in-process twin,
``rose_core.testing.inprocess_channel``): every rejected frame is logged, counted in
``rose_rejected_messages_total{reason}`` and dropped; the endpoint and its other peers keep working.

No peer can stall an endpoint (rules, not buffer sizes):

- The I/O thread never blocks on a send. A message for a peer whose queue is full (``SEND_HWM``
  messages it has not read: a stopped dashboard, a half-open link) or that is gone is dropped and
  counted in ``rose_dropped_messages_total{reason}``; the senders' inproc pipe is unbounded, so a caller
  (the controller's loop, the executor's event loop) never blocks either. Everything the control plane
  sends is either repeated (heartbeats, status) or covered by a timeout on the other side (turns).
- ZMQ heartbeats on every connection (``HEARTBEAT_*``): a peer silent for ``HEARTBEAT_TIMEOUT_MS`` is
  disconnected, its queue freed; a DEALER reconnects by itself.
- A DEALER whose controller is down queues up to ``SEND_HWM`` messages for the next one and drops the
  rest (a restarted controller answers that stale burst's first message with ``no_handshake``, and the
  executor joins it again: ``rose_executor.agent``).
- No ``ROUTER_HANDOVER``: a second connection with a routing id already connected is refused by libzmq
  until the first one is gone (closed, or silent past the heartbeat timeout), so nobody takes over a live
  executor's route (and the signed turns sent on it) by connecting with its id.
- ``MAXMSGSIZE``: libzmq drops a connection whose frame is larger than the message limit before it
  is buffered whole (before authentication).

Optional encryption (``encrypt=True`` on the server, ``encrypt_with`` on each client): CurveZMQ on the
connection. The server's Curve keypair is derived from the observer key (``curve_server_keys``), so every
holder of a ROSE credential (the secret, or the dashboard's observer key) can reach an encrypting controller
and nobody else can read the traffic; clients make a fresh keypair each. Authentication stays the MAC's.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import threading
import time
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, Self, TypeVar

import msgspec
import zmq
import zmq.utils.z85

from rose_core.support.errors import RoseError
from rose_core.support.metrics import DROPPED_MESSAGES
from rose_core.transport.control_endpoint import ServerKeys, endpoint_framers
from rose_core.transport.inbound import Inbound

log = logging.getLogger(__name__)
InT = TypeVar("InT")
_ids = itertools.count()
SEND_HWM = 1000
"""Messages queued for one peer before later ones to it are dropped."""
DRAIN_BATCH = 1024
"""Messages an I/O pass takes in (or sends out) before it lets other work run."""
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 10_000
"""A connection silent this long (no message, no ZMQ heartbeat) is closed."""


def control_socket(ctx: zmq.Context[Any], sock_type: int, max_message_bytes: int) -> zmq.Socket[Any]:
    """A socket with the options every control endpoint has (the rules above)."""
    sock: zmq.Socket[Any] = ctx.socket(sock_type)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, SEND_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    return sock


def connect_client(sock: zmq.Socket[Any], address: str, peer_id: str, encrypt_with: bytes | None) -> None:
    """A DEALER's identity, optional CurveZMQ and connection; ``RoseError`` for an address ZMQ cannot use."""
    if encrypt_with is not None:
        public, private = zmq.curve_keypair()
        sock.curve_serverkey = curve_server_keys(encrypt_with)[0]
        sock.curve_publickey = public
        sock.curve_secretkey = private
    sock.setsockopt(zmq.ROUTING_ID, peer_id.encode())
    try:
        sock.connect(address)
    except zmq.ZMQError as exc:
        raise RoseError(f"bad controller address {address!r} ({exc.strerror}): use tcp://HOST:PORT") from exc


def count_drop(peer: bytes, exc: zmq.ZMQError, dropped: int) -> None:
    reason = "peer_full" if exc.errno == zmq.EAGAIN else "peer_gone"
    DROPPED_MESSAGES.labels(reason).inc()
    if dropped <= 20 or dropped % 1000 == 0:
        log.warning("dropped an outgoing message for %r (%s, %d so far): %s", peer, reason, dropped, exc)


def curve_server_keys(link_key: bytes) -> tuple[bytes, bytes]:
    """The controller's CurveZMQ ``(public, secret)`` keys (Z85), derived from ``link_key``: the observer key
    (``rose_core.protocol.auth.observer_key``), which both the secret's holders and a dashboard can compute."""
    secret = zmq.utils.z85.encode(hmac.new(link_key, b"rose-curve-server", hashlib.sha256).digest())
    return zmq.curve_public(secret), secret


class ThreadedEndpoint(Inbound[InT]):
    """Shared machinery of both ends: the I/O thread and the outbound pipe."""

    def __init__(
        self,
        sock_type: int,
        secret: bytes,
        decode_type: Any,
        on_message: Callable[[bytes, InT], None] | None,
        max_message_bytes: int,
        keys: ServerKeys | None = None,
    ) -> None:
        opener, self._send_framer = endpoint_framers(secret, decode_type, max_message_bytes, keys)
        super().__init__(opener, on_message)  # opened on the I/O thread
        self._ctx = zmq.Context()
        self._sock = control_socket(self._ctx, sock_type, max_message_bytes)
        self._pipe_addr = f"inproc://rose-out-{next(_ids)}"
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)  # unbounded: the I/O thread drains it and never blocks
        self._pull.bind(self._pipe_addr)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.connect(self._pipe_addr)
        self._push_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queued = 0
        self._forwarded = 0
        self.dropped = 0
        """Outgoing messages dropped since start (their peer's queue was full, or it was gone)."""

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- the I/O thread

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            events = dict(poller.poll(50))
            if self._pull in events:
                self._flush_outbound()
            if self._sock in events:
                self._drain_inbound()

    def _flush_outbound(self) -> None:
        for _ in range(DRAIN_BATCH):
            try:
                frames = self._pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self._sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as exc:
                self._dropped(frames, exc)
            finally:
                self._forwarded += 1

    def _dropped(self, frames: list[Any], exc: zmq.ZMQError) -> None:
        self.dropped += 1
        count_drop(self._peer_of(frames), exc, self.dropped)

    def _drain_inbound(self) -> None:
        for _ in range(DRAIN_BATCH):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            peer, body = self._split(frames)
            self._receive(peer, [f.buffer for f in body])

    def _send_raw(self, peer: bytes, frames: list[Any]) -> None:
        try:
            self._sock.send_multipart(self._route(peer, frames), zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            log.debug("could not notify %r: %s", peer[:32], exc)

    def _send(self, peer: bytes, msg: msgspec.Struct) -> None:
        with self._push_lock:
            frames = self._route(peer, self._send_framer.seal(msg, key=self.key_of(peer), peer=peer))
            self._push.send_multipart(frames, copy=False)
            self._queued += 1

    # ---------------------------------------------------------------- per socket type

    @abstractmethod
    def _split(self, frames: list[Any]) -> tuple[bytes, list[Any]]:
        """An arrived multipart message as (peer, message frames)."""

    @abstractmethod
    def _route(self, peer: bytes, frames: list[Any]) -> list[Any]:
        """Message frames as this socket type sends them to ``peer``."""

    @abstractmethod
    def _peer_of(self, frames: list[Any]) -> bytes:
        """Whom outgoing ``frames`` (as ``_route`` made them) are for."""
