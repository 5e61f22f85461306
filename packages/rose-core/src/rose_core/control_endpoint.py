"""What the controller and its peers need of a control-channel endpoint, whatever carries the bytes.

Two implementations of each: over ZMQ (``rose_core.channel.ControlServer`` / ``ControlClient``, the running
system) and in one process (``rose_core.inprocess_channel.InProcessServer`` / ``InProcessClient``, for tests).
Both run every message through the same ``Framer`` and ``Inbound`` code; only the transport differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import msgspec

from rose_core.messages import FromController, Goodbye, Hello, StatusAck, ToController

ServerCallback = Callable[[bytes, ToController], None]
"""Called with ``(peer routing id, message)`` for every accepted message, instead of queueing it for ``recv``."""
ClientCallback = Callable[[bytes, FromController], None]


class ServerEndpoint(Protocol):
    """The controller's end: many peers, each known by its routing id."""

    address: str
    """Where peers connect (``tcp://HOST:PORT`` over ZMQ)."""

    def send(self, peer: bytes, msg: FromController) -> None: ...

    def recv(self, timeout: float | None = None) -> tuple[bytes, ToController] | None: ...

    def wake(self) -> None:
        """End the current ``recv`` wait now, from any thread."""
        ...

    def close(self) -> None: ...


class ClientEndpoint(Protocol):
    """A peer's end, connected to one controller."""

    def send(self, msg: msgspec.Struct) -> None:
        """Send a message (a ``ToController``; anything else is rejected by the controller as ``unknown_type``)."""

    def recv(self, timeout: float | None = None) -> tuple[bytes, FromController] | None: ...

    def close(self) -> None: ...


def observer_may_send(msg: object) -> bool:
    """What a peer holding only the observer key may send a controller: say Hello as an observer, acknowledge
    the status it was sent, and Goodbye."""
    return isinstance(msg, Goodbye | StatusAck) or (isinstance(msg, Hello) and msg.kind == "observer")
