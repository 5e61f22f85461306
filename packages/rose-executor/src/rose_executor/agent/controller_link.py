"""The executor's control channel, bridged into asyncio.

Over ZMQ the client is ``rose_core.transport.channel.LoopControlClient``: a DEALER the event loop owns, whose messages
are opened on the loop and handed to ``recv`` directly. The in-process twin (``rose_core.testing.inprocess_channel.
InProcessClient``, in tests) and the threaded ``ControlClient`` call back on another thread (the sender's,
or the endpoint's I/O thread): those messages reach the loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Protocol

from rose_core.protocol.messages import FromController, ToController
from rose_core.transport.control_endpoint import ClientCallback, ClientEndpoint
from rose_core.transport.loop_control_client import LoopControlClient

log = logging.getLogger(__name__)


class ClientFactory(Protocol):
    """What ``ControlClient`` and ``InProcessClient`` are called with."""

    def __call__(
        self, address: str, secret: bytes, peer_id: str, on_message: ClientCallback | None = None
    ) -> ClientEndpoint: ...


class ControllerLink:
    """Send to the controller from the event loop; await what it sends back."""

    def __init__(self, address: str, secret: bytes, peer_id: str, connect: ClientFactory = LoopControlClient) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._inbox: asyncio.Queue[FromController] = asyncio.Queue()
        self._client = connect(address, secret, peer_id, on_message=self._on_message)
        self._closed = False

    def _on_message(self, _peer: bytes, msg: FromController) -> None:
        if threading.get_ident() == self._loop_thread:  # a loop-owned client
            self._inbox.put_nowait(msg)
            return
        with contextlib.suppress(RuntimeError):  # the loop is gone: we are shutting down
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, msg)

    def send(self, msg: ToController) -> None:
        if not self._closed:
            self._client.send(msg)

    def down_for(self, now: float) -> float:
        """Seconds the link to the controller has been down (``LoopControlClient``); 0 from a client that cannot
        tell (the in-process twin)."""
        return self._client.down_for(now) if isinstance(self._client, LoopControlClient) else 0.0

    async def recv(self, timeout: float | None = None) -> FromController | None:
        """The next message, or ``None`` after ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self._inbox.get(), timeout)
        except TimeoutError:
            return None

    async def close(self, flush_s: float = 0.2) -> None:
        """Give what is queued ``flush_s`` to leave, then close the endpoint."""
        if self._closed:
            return
        self._closed = True
        await asyncio.sleep(flush_s)
        if isinstance(self._client, LoopControlClient):
            self._client.close()  # on its loop; what was sent has had flush_s to leave
        else:
            await asyncio.to_thread(self._client.close)
