"""The receiving half every control endpoint shares, over ZMQ (``channel``) or in one process
(``inprocess_channel``): open each arrived message with a ``Framer`` (size, envelope, version, signature,
decoding), check that it is fresh (``rose_core.protocol.replay_guard``: a captured message played again is rejected as
``replay``), reject what fails, and hand the rest to a callback or to the queue ``recv`` reads.

A rejected message is logged (rate-limited), counted in ``rose_rejected_messages_total{reason}`` and in
``rejected``, and dropped; a peer that failed authentication or the version check gets one unsigned notice
naming the fix. The endpoint and its other peers keep working.

What a peer without a key can make this endpoint hold is bounded: an unsigned notice is refused above
``MAX_NOTICE_BYTES`` before it is decoded, at most ``NOTICES_PER_S`` of them a second are delivered (the rest
are dropped as ``notice_flood``), and the inbox holds at most ``max_inbox`` messages (more are dropped as
``inbox_full``: the reader is not keeping up). Each refusal costs the I/O thread a size check, so garbage
cannot keep it from the heartbeats behind it.
"""

from __future__ import annotations

import logging
import queue
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from rose_core.protocol.replay_guard import ReplayGuard
from rose_core.protocol.wire import OWN, Framer, is_unsigned_notice
from rose_core.support.errors import ProtocolError
from rose_core.support.metrics import REJECTED_MESSAGES

log = logging.getLogger(__name__)
InT = TypeVar("InT")
NOTIFIED_REASONS = ("unauthenticated", "wrong_version")
"""Rejections the peer is told about (once per peer and reason): it cannot fix what it is not told."""
NOTICES_PER_S = 10
"""Unsigned notices delivered per second, from every peer together (anyone can send them)."""
MAX_INBOX = 100_000
"""Messages waiting for the reader, by default: far beyond what a healthy fleet queues during a train step."""


class Inbound(ABC, Generic[InT]):
    """Opens and delivers arrived messages of type ``InT`` (the channel's union); subclasses move the bytes.

    ``_receive`` is called by whoever plays the I/O thread; ``_send_raw`` is how a notice goes back."""

    def __init__(self, framer: Framer, on_message: Callable[[bytes, InT], None] | None,
                 max_inbox: int = MAX_INBOX) -> None:
        self._framer = framer
        self._max_inbox = max_inbox
        self._notices: deque[float] = deque(maxlen=NOTICES_PER_S)
        self._replays = ReplayGuard()
        self._on_message = on_message
        self._inbox: queue.SimpleQueue[tuple[bytes, InT] | None] = queue.SimpleQueue()
        """A ``SimpleQueue``, not a ``Queue``: its blocking ``get`` holds no Python-level lock, so the
        KeyboardInterrupt that `rose run` raises from its SIGTERM handler cannot land between a lock's acquire
        and its ``with`` block and leave it held (seen: the I/O thread's ``put`` and the controller's ``get``
        both waiting forever on the ``Queue``'s mutex while `rose run` shut down)."""
        self._notified: set[tuple[bytes, str]] = set()
        self.rejected = 0
        self.keys: dict[bytes, str] = {}
        """The key (``rose_core.protocol.wire.MEMBER`` or ``GUEST``) of each peer whose last accepted message was not signed
        with this endpoint's own: replies to that peer are signed with it too (``key_of``)."""

    def recv(self, timeout: float | None = None) -> tuple[bytes, InT] | None:
        """The next ``(peer, message)``, or ``None`` after ``timeout`` seconds (never, with a callback) or
        once ``wake`` was called."""
        try:
            return self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def wake(self) -> None:
        """Any thread: end the current (or next) ``recv`` wait now (it returns ``None``), so the receiving
        thread handles local work (a gateway call) without waiting out its timeout."""
        self._inbox.put(None)

    def _receive(self, peer: bytes, frames: Sequence[Any]) -> None:
        msg = self._open(peer, frames)
        if msg is not None:
            self._deliver(peer, msg)

    def _open(self, peer: bytes, frames: Sequence[Any]) -> InT | None:
        """The decoded message, or ``None`` when it was rejected."""
        try:
            msg, key, stamp = self._framer.open_keyed(frames, peer)
            if stamp is not None:  # None: an unsigned notice, shown and never acted on
                self._replays.check(peer, stamp, time.time())
        except ProtocolError as exc:
            self._reject(peer, exc)
            return None
        if stamp is None:
            pass  # an unsigned notice says nothing of the key its sender holds
        elif key == OWN:
            self.keys.pop(peer, None)
        else:
            self.keys[peer] = key
        opened: InT = msg
        return opened

    def key_of(self, peer: bytes) -> str:
        """The key to sign what is sent to ``peer`` with (``rose_core.protocol.wire.OWN`` unless it spoke with another)."""
        return self.keys.get(peer, OWN)

    def _deliver(self, peer: bytes, msg: InT) -> None:
        if is_unsigned_notice(msg) and not self._notice_due(time.monotonic()):
            self._reject(peer, ProtocolError("notice_flood", f"over {NOTICES_PER_S} unsigned notices a second"))
        elif self._on_message is not None:
            self._on_message(peer, msg)
        elif self._inbox.qsize() >= self._max_inbox:
            self._reject(peer, ProtocolError("inbox_full", f"{self._max_inbox} messages wait for the reader"))
        else:
            self._inbox.put((peer, msg))

    def _notice_due(self, now: float) -> bool:
        """Whether one more unsigned notice fits in this second's allowance (and count it if so)."""
        if len(self._notices) == NOTICES_PER_S and now - self._notices[0] < 1.0:
            return False
        self._notices.append(now)
        return True

    def _reject(self, peer: bytes, exc: ProtocolError) -> None:
        self.rejected += 1
        REJECTED_MESSAGES.labels(exc.reason).inc()
        if self.rejected <= 20 or self.rejected % 1000 == 0:
            log.warning("rejected a message from %r (%s): %s", peer[:32], exc.reason, str(exc))  # not exc: its
            # traceback holds the frames (a record kept by a handler would keep up to 64 MiB alive)
        if exc.reason in NOTIFIED_REASONS and (peer, exc.reason) not in self._notified:
            self._notified.add((peer, exc.reason))
            self._send_raw(peer, self._framer.notice(exc.reason, str(exc)))

    @abstractmethod
    def _send_raw(self, peer: bytes, frames: list[Any]) -> None:
        """Send already-sealed frames to ``peer`` (a rejection notice), however this endpoint moves bytes."""
