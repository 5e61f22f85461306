"""The one accept loop of rose-transfer's TCP servers (the weight server, the shard intake): accept until
cancelled, back off (never stop) when accepting fails, hand each connection to a task of its own, and cancel
those tasks when the loop ends."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)
Accepted = Callable[[socket.socket, Any], Coroutine[Any, Any, None] | None]
"""What to do with an accepted socket and its peer address: a coroutine to run as the connection's task, or
None when the connection was refused (and closed) at once."""


async def accept_forever(listener: socket.socket, accepted: Accepted, what: str) -> None:
    """Accept connections on ``listener`` until cancelled; ``what`` names the server in the log."""
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    handlers: set[asyncio.Task[None]] = set()
    try:
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
            except OSError as exc:  # e.g. out of file descriptors: back off, keep serving
                log.warning("%s cannot accept a connection: %s", what, exc)
                await asyncio.sleep(0.1)
                continue
            handler = accepted(sock, address)
            if handler is not None:
                task = asyncio.create_task(handler)
                handlers.add(task)
                task.add_done_callback(handlers.discard)
    finally:
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
