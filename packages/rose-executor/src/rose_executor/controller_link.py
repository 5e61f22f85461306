"""The executor's control channel, bridged into asyncio.

The client endpoint (``rose_core.channel.ControlClient`` over ZMQ, or ``rose_core.inprocess_channel.
InProcessClient``, its in-process twin, in tests) hands each decoded message to its callback: on its I/O
thread over ZMQ, in the sender's thread in process. The callback passes it to the event loop with
``call_soon_threadsafe``, where the agent awaits ``recv``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from rose_core.channel import ControlClient
from rose_core.control_endpoint import ClientCallback, ClientEndpoint
from rose_core.messages import FromController, ToController

log = logging.getLogger(__name__)


class ClientFactory(Protocol):
    """What ``ControlClient`` and ``InProcessClient`` are called with."""

    def __call__(
        self, address: str, secret: bytes, peer_id: str, on_message: ClientCallback | None = None
    ) -> ClientEndpoint: ...


class ControllerLink:
    """Send to the controller from the event loop; await what it sends back."""

    def __init__(self, address: str, secret: bytes, peer_id: str, connect: ClientFactory = ControlClient) -> None:
        self._loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue[FromController] = asyncio.Queue()
        self._client = connect(address, secret, peer_id, on_message=self._on_message)
        self._closed = False

    def _on_message(self, _peer: bytes, msg: FromController) -> None:
        # Runs on the endpoint's I/O thread (ZMQ) or the sender's thread (in process).
        with contextlib.suppress(RuntimeError):  # the loop is gone: we are shutting down
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, msg)

    def send(self, msg: ToController) -> None:
        if not self._closed:
            self._client.send(msg)

    async def recv(self, timeout: float | None = None) -> FromController | None:
        """The next message, or ``None`` after ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self._inbox.get(), timeout)
        except TimeoutError:
            return None

    async def close(self, flush_s: float = 0.2) -> None:
        """Give the I/O thread ``flush_s`` to send what is queued, then close the endpoint."""
        if self._closed:
            return
        self._closed = True
        await asyncio.sleep(flush_s)
        await asyncio.to_thread(self._client.close)
