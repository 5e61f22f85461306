"""A peer's DEALER owned by the running asyncio loop (the executor's link). The rules it keeps: ``zmq_endpoint``."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Self

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from rose_core.protocol.auth import Signer
from rose_core.protocol.messages import FromController
from rose_core.protocol.wire import DEFAULT_MAX_MESSAGE_BYTES, Framer
from rose_core.support.errors import RoseError
from rose_core.transport.control_endpoint import ClientCallback
from rose_core.transport.inbound import Inbound
from rose_core.transport.zmq_endpoint import DRAIN_BATCH, connect_client, control_socket, count_drop


class LoopControlClient(Inbound[FromController]):
    """A peer's DEALER owned by the running asyncio loop: no I/O thread, no pipe (the executor's link).

    ``send`` writes to the socket from the loop (non-blocking: a full queue or a lost controller drops the
    message, counted as in ``ControlClient``); the loop watches the socket's descriptor and opens what arrives
    on the loop, so ``on_message`` runs there. Same socket options, encryption and ``Inbound`` checks as
    ``ControlClient``; two thread hand-offs fewer on each message each way. Call everything on the loop that
    made it.

    ZMQ's descriptor signals edges, not levels: an operation on the socket (a send, too) can take in what
    arrived without it firing again, so every send is followed by a drain scheduled on the loop.

    ``down_for(now)`` says how long the link to the controller has been down (0 while it is up), from the
    socket's monitor: a controller process that died drops the connection at once, one that went silent
    (stopped, unreachable) when ZMQ's heartbeats time out (``HEARTBEAT_TIMEOUT_MS``).
    """

    def __init__(self, address: str, secret: bytes, peer_id: str, on_message: ClientCallback | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, *, encrypt_with: bytes | None = None) -> None:
        signer = Signer(secret)
        super().__init__(Framer(signer, FromController, max_message_bytes), on_message)
        self._send_framer = Framer(signer, FromController, max_message_bytes)
        self._loop = asyncio.get_running_loop()
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock = control_socket(self._ctx, zmq.DEALER, max_message_bytes)
        # the monitor before the connection: a handshake completed before it was attached is an event it never
        # sees, and the link would count as down from the start (a lease ended for a controller that was there)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        try:
            connect_client(self._sock, address, peer_id, encrypt_with)
        except RoseError:
            self._monitor.close(0)
            self._sock.close(0)
            self._ctx.term()
            raise
        self._closed = False
        self._drain_scheduled = False
        self.dropped = 0
        """Outgoing messages dropped since start (the queue to the controller was full)."""
        self._fd: int = self._sock.FD
        self._loop.add_reader(self._fd, self._drain)
        self._schedule_drain()  # what arrived before the reader was added raised no edge it saw
        self._down_since: float | None = time.monotonic()
        self._monitor_fd: int = self._monitor.FD
        self._loop.add_reader(self._monitor_fd, self._watch_link)
        self._loop.call_soon(self._watch_link)

    def down_for(self, now: float) -> float:
        """Seconds the link to the controller has been down (never up yet counts from the start); 0 while up."""
        return 0.0 if self._down_since is None else max(0.0, now - self._down_since)

    def _watch_link(self) -> None:
        """The monitor's events: up on a completed handshake, down on a disconnect."""
        while not self._closed and int(self._monitor.EVENTS) & zmq.POLLIN:
            event = recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._down_since = None
            elif event == zmq.EVENT_DISCONNECTED and self._down_since is None:
                self._down_since = time.monotonic()

    def send(self, msg: msgspec.Struct) -> None:
        """On the loop: put ``msg`` on the wire now, or drop it (counted) when the socket cannot take it."""
        if self._closed:
            return
        self._write(self._send_framer.seal(msg))

    def close(self, flush_s: float = 0.5) -> None:
        """On the loop: stop watching the socket; what was sent gets up to ``flush_s`` to leave (ZMQ's linger).
        Blocks the loop at most that long, only while messages are still queued."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_reader(self._monitor_fd)
        self._sock.disable_monitor()
        self._monitor.close(0)
        self._sock.close(linger=int(flush_s * 1000))
        self._ctx.term()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, frames: list[Any]) -> None:
        try:
            self._sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            self.dropped += 1
            count_drop(b"controller", exc, self.dropped)
        self._schedule_drain()

    def _send_raw(self, peer: bytes, frames: list[Any]) -> None:
        self._write(frames)

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Open what has arrived: at most a batch per turn of the loop, so a burst cannot starve the loop."""
        self._drain_scheduled = False
        for _ in range(DRAIN_BATCH):
            if self._closed or not int(self._sock.EVENTS) & zmq.POLLIN:
                return
            frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            self._down_since = None  # a frame from the controller: the link is up, whatever the monitor saw
            self._receive(b"controller", [f.buffer for f in frames])
        self._schedule_drain()
