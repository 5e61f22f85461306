"""What the controller and its peers need of a control-channel endpoint, whatever carries the bytes.

Two implementations of each: over ZMQ (``rose_core.transport.channel.ControlServer`` / ``ControlClient``, the running
system) and in one process (``rose_core.testing.inprocess_channel.InProcessServer`` / ``InProcessClient``, for tests).
Both run every message through the same ``Framer`` and ``Inbound`` code; only the transport differs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, TypedDict

import msgspec

from rose_core.protocol.auth import Signer, executor_signer, observer_key
from rose_core.protocol.messages import ErrorReport, FromController, Goodbye, Hello, StatusAck, ToController
from rose_core.protocol.wire import Framer

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


def executor_may_send(peer: bytes, msg: object) -> bool:
    """What a peer holding executor ``peer``'s own key (``rose_core.protocol.auth.executor_key``) may send: what an
    executor sends, naming itself (its routing id) and nobody else; an error report (it names nobody: a
    refusal to a second job, or why it cannot go on) is its own."""
    own_id = peer.decode(errors="replace")
    if isinstance(msg, ErrorReport):
        return True
    if isinstance(msg, Hello):
        return msg.kind == "executor" and msg.peer_id == own_id
    if isinstance(msg, Goodbye):
        return msg.peer_id == own_id
    return getattr(msg, "executor_id", None) == own_id


class ServerKeys(TypedDict, total=False):
    """The keys a controller's endpoint accepts besides the secret, and what each may send (``rose_core.protocol.wire``)."""

    guest: Signer
    guest_may: Callable[[Any], bool]
    member: Callable[[bytes], Signer]
    member_may: Callable[[bytes, Any], bool]


def server_keys(secret: bytes) -> ServerKeys:
    """Executors' own keys (one per routing id) and the dashboard's observer key, all derived from ``secret``."""
    return ServerKeys(guest=Signer(observer_key(secret)), guest_may=observer_may_send,
                      member=partial(_member_signer, secret), member_may=executor_may_send)


def _member_signer(secret: bytes, peer: bytes) -> Signer:
    return executor_signer(secret, peer.decode(errors="replace"))


def endpoint_framers(secret: bytes, decode_type: Any, max_message_bytes: int,
                     keys: ServerKeys | None = None) -> tuple[Framer, Framer]:
    """An endpoint's two framers over one signer: the one that opens what arrives, the one that seals what leaves
    (each keeps its own stamp sequence)."""
    signer = Signer(secret)
    return (Framer(signer, decode_type, max_message_bytes, **(keys or ServerKeys())),
            Framer(signer, decode_type, max_message_bytes, **(keys or ServerKeys())))
