"""The executor's control channel, bridged into asyncio.

``rose_core.channel.ControlClient`` does its socket I/O on its own thread; its callback hands each decoded
message to the event loop with ``call_soon_threadsafe``, where the agent awaits ``recv``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec

from rose_core.channel import ControlClient

log = logging.getLogger(__name__)


class ControllerLink:
    """Send to the controller from the event loop; await what it sends back."""

    def __init__(self, address: str, secret: bytes, peer_id: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._client = ControlClient(address, secret, peer_id, on_message=self._on_message)
        self._closed = False

    def _on_message(self, _peer: bytes, msg: Any) -> None:
        # Runs on the ZMQ I/O thread.
        with contextlib.suppress(RuntimeError):  # the loop is gone: we are shutting down
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, msg)

    def send(self, msg: msgspec.Struct) -> None:
        if not self._closed:
            self._client.send(msg)

    async def recv(self, timeout: float | None = None) -> Any | None:
        """The next message, or ``None`` after ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self._inbox.get(), timeout)
        except TimeoutError:
            return None

    async def close(self, flush_s: float = 0.2) -> None:
        """Give the I/O thread ``flush_s`` to send what is queued, then close the socket."""
        if self._closed:
            return
        self._closed = True
        await asyncio.sleep(flush_s)
        await asyncio.to_thread(self._client.close)
