"""The threaded ends of the control plane: the controller's bound ROUTER (``ControlServer``) and a peer's DEALER
with its own I/O thread (``ControlClient``: the dashboard's). The rules they keep: ``zmq_endpoint``."""

from __future__ import annotations

from typing import Any

import msgspec
import zmq

from rose_core.protocol.auth import observer_key
from rose_core.protocol.messages import FromController, ToController
from rose_core.protocol.wire import DEFAULT_MAX_MESSAGE_BYTES
from rose_core.support.errors import RoseError
from rose_core.transport.control_endpoint import ClientCallback, ServerCallback, server_keys
from rose_core.transport.zmq_endpoint import ThreadedEndpoint, connect_client, curve_server_keys


class ControlServer(ThreadedEndpoint[ToController]):
    """The controller's bound ROUTER socket. Peers are identified by their routing id. ``encrypt``: CurveZMQ
    (every client must connect with ``encrypt_with``)."""

    def __init__(
        self,
        address: str,
        secret: bytes,
        on_message: ServerCallback | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        encrypt: bool = False,
    ) -> None:
        # executors with their own keys speak for themselves; a dashboard with the observer key may watch
        super().__init__(zmq.ROUTER, secret, ToController, on_message, max_message_bytes, server_keys(secret))
        if encrypt:
            public, private = curve_server_keys(observer_key(secret))
            self._sock.curve_server = True
            self._sock.curve_publickey = public
            self._sock.curve_secretkey = private
        self.encrypted = encrypt
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as exc:
            self.close()
            raise RoseError(
                f"cannot listen on {address} ({exc.strerror}): pick a free port with --port or stop the other controller"
            ) from exc
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.start()

    def send(self, peer: bytes, msg: FromController) -> None:
        self._send(peer, msg)

    def seal(self, peer: bytes, msg: FromController) -> list[Any]:
        """The frames ``send`` would put on the wire for ``peer`` (stamped with this endpoint's next number)."""
        with self._push_lock:
            return self._send_framer.seal(msg, key=self.key_of(peer), peer=peer)

    def send_frames(self, peer: bytes, frames: list[Any]) -> None:
        """Put already-sealed (or raw) frames on the wire to ``peer``, through the I/O thread like ``send``."""
        with self._push_lock:
            self._push.send_multipart(self._route(peer, frames), copy=False)
            self._queued += 1

    def _split(self, frames: list[Any]) -> tuple[bytes, list[Any]]:
        return bytes(frames[0].buffer), frames[1:]

    def _route(self, peer: bytes, frames: list[Any]) -> list[Any]:
        return [peer, *frames]

    def _peer_of(self, frames: list[Any]) -> bytes:
        return bytes(frames[0].buffer if isinstance(frames[0], zmq.Frame) else frames[0])[:32]


class ControlClient(ThreadedEndpoint[FromController]):
    """A peer's DEALER socket connected to the controller. ``encrypt_with``: the observer key, to reach a
    controller that encrypts (CurveZMQ); ``None``: plain."""

    def __init__(self, address: str, secret: bytes, peer_id: str, on_message: ClientCallback | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, *, encrypt_with: bytes | None = None) -> None:
        super().__init__(zmq.DEALER, secret, FromController, on_message, max_message_bytes)
        try:
            connect_client(self._sock, address, peer_id, encrypt_with)
        except RoseError:
            self.close()
            raise
        self.start()

    def send(self, msg: msgspec.Struct) -> None:
        self._send(b"", msg)

    def _split(self, frames: list[Any]) -> tuple[bytes, list[Any]]:
        return b"controller", list(frames)

    def _route(self, peer: bytes, frames: list[Any]) -> list[Any]:
        return frames

    def _peer_of(self, frames: list[Any]) -> bytes:
        return b"controller"
