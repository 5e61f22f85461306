"""The in-process twin of the ZMQ control channel: the real serde, wire and auth, no sockets, no threads.

``InProcessServer`` / ``InProcessClient`` have the public surface of ``ControlServer`` / ``ControlClient``
(``address``, ``send``, ``recv(timeout)``, ``on_message``, ``close``, ``rejected``). Every message is sealed
by a real ``Framer`` (encoded, signed), copied frame by frame as a wire would, and opened on arrival by the
same ``Inbound`` code as over ZMQ (size check, envelope, version, signature, decoding; rejections logged,
counted in ``rose_rejected_messages_total`` and answered with the same notices). Only the transport is an
in-memory queue.

Delivery is synchronous, which makes tests deterministic: when ``send`` returns, the message has been opened
at the other end and is waiting in its ``recv`` queue (or its ``on_message`` callback has run, in the
sender's thread, where over ZMQ the I/O thread would run it). A test sends, then calls ``Controller.pump(0)``
once, and the message has been handled. ``send_frames`` puts raw frames on the wire (malformed, unsigned,
oversized, wrong version) so the rejection paths run the real code.

Clients find a server by its ``address`` (``inprocess://control-N`` unless one is given), as over ZMQ.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

import msgspec

from rose_core.protocol.messages import FromController, ToController
from rose_core.protocol.wire import DEFAULT_MAX_MESSAGE_BYTES
from rose_core.support.errors import RoseError
from rose_core.transport.control_endpoint import (
    ClientCallback,
    ServerCallback,
    ServerKeys,
    endpoint_framers,
    server_keys,
)
from rose_core.transport.inbound import Inbound

log = logging.getLogger(__name__)
InT = TypeVar("InT")
CONTROLLER_PEER = b"controller"
"""The peer name a client's messages from the server carry (as ``ControlClient`` reports it)."""
_ids = itertools.count(1)
_listening: dict[str, InProcessServer] = {}
_listening_lock = threading.Lock()


def _on_the_wire(frames: Sequence[Any]) -> list[bytes]:
    """The bytes a socket would carry: the receiver never shares memory with the sender."""
    return [bytes(memoryview(f)) for f in frames]


class _InProcessEnd(Inbound[InT]):
    """Sealing, opening and the lifecycle both ends share."""

    def __init__(self, secret: bytes, decode_type: Any, on_message: Callable[[bytes, InT], None] | None,
                 max_message_bytes: int, keys: ServerKeys | None = None) -> None:
        opener, self._send_framer = endpoint_framers(secret, decode_type, max_message_bytes, keys)
        super().__init__(opener, on_message)
        self._send_lock = threading.Lock()
        self._open_lock = threading.RLock()  # a notice sent while rejecting may come back to this end
        self.closed = False

    def _seal(self, msg: msgspec.Struct, peer: bytes = b"") -> list[bytes]:
        with self._send_lock:
            return _on_the_wire(self._send_framer.seal(msg, key=self.key_of(peer), peer=peer))

    def _arrive(self, peer: bytes, frames: list[bytes]) -> None:
        """The other end's transport hands over one message: open it (or reject it), then deliver it."""
        if self.closed:
            log.debug("dropped a message from %r: the endpoint is closed", peer[:32])
            return
        with self._open_lock:
            msg = self._open(peer, frames)
        if msg is not None:
            self._deliver(peer, msg)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, flush_s: float = 0.0) -> None:
        """Stop receiving; ``flush_s`` is accepted for ``ControlServer.close`` compatibility (nothing is queued)."""
        self.closed = True


class InProcessServer(_InProcessEnd[ToController]):
    """The controller's end. Peers are identified by their ``peer_id`` (a routing id over ZMQ); a second
    client with the id of one still connected is refused (``RoseError``), as the ZMQ server refuses such a
    connection (no ``ROUTER_HANDOVER``)."""

    def __init__(
        self,
        secret: bytes,
        *,
        address: str = "",
        on_message: ServerCallback | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        super().__init__(secret, ToController, on_message, max_message_bytes, server_keys(secret))
        self._peers: dict[bytes, InProcessClient] = {}
        self.address = address or f"inprocess://control-{next(_ids)}"
        with _listening_lock:
            if self.address in _listening:
                raise RoseError(f"cannot listen on {self.address} (another in-process server has it): pick another address")
            _listening[self.address] = self

    def send(self, peer: bytes, msg: FromController) -> None:
        self._send_raw(peer, self._seal(msg, peer))

    def send_frames(self, peer: bytes, frames: Sequence[Any]) -> None:
        """Put raw frames on the wire to ``peer``, bypassing the sending framer."""
        self._send_raw(peer, _on_the_wire(frames))

    def close(self, flush_s: float = 0.0) -> None:
        with _listening_lock:
            if _listening.get(self.address) is self:
                del _listening[self.address]
        self._peers.clear()
        super().close(flush_s)

    def _send_raw(self, peer: bytes, frames: list[Any]) -> None:
        client = self._peers.get(peer)
        if client is None:
            log.debug("dropped an outgoing message: no peer %r", peer[:32])
            return
        client._arrive(CONTROLLER_PEER, frames)

    def _connect(self, peer: bytes, client: InProcessClient) -> None:
        if peer in self._peers:
            raise RoseError(f"{peer.decode(errors='replace')!r} is connected already: close it before connecting "
                            "another client with its id")
        self._peers[peer] = client

    def _disconnect(self, peer: bytes, client: InProcessClient) -> None:
        if self._peers.get(peer) is client:
            del self._peers[peer]


class InProcessClient(_InProcessEnd[FromController]):
    """A peer's end, connected to the ``InProcessServer`` listening on ``address``; the constructor takes
    what ``ControlClient``'s does."""

    def __init__(self, address: str, secret: bytes, peer_id: str, on_message: ClientCallback | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        super().__init__(secret, FromController, on_message, max_message_bytes)
        with _listening_lock:
            server = _listening.get(address)
        if server is None:
            raise RoseError(f"no in-process controller listens on {address!r}: use the InProcessServer's address")
        self.peer_id = peer_id.encode()
        self._server = server
        server._connect(self.peer_id, self)

    def send(self, msg: msgspec.Struct) -> None:
        self._send_raw(CONTROLLER_PEER, self._seal(msg))

    def send_frames(self, frames: Sequence[Any]) -> None:
        """Put raw frames on the wire to the server, bypassing the sending framer (a raw DEALER's
        ``send_multipart``)."""
        self._send_raw(CONTROLLER_PEER, _on_the_wire(frames))

    def close(self, flush_s: float = 0.0) -> None:
        self._server._disconnect(self.peer_id, self)
        super().close(flush_s)

    def _send_raw(self, peer: bytes, frames: list[Any]) -> None:
        if self.closed:
            log.debug("dropped an outgoing message: the client is closed")
            return
        self._server._arrive(self.peer_id, frames)
