"""What a weight server (a publisher, a relay) runs and closes together: its loop thread, the server on it, the
TCP sockets it listens on and the UCX listeners on that thread. Closing is idempotent: the UCX listeners on
their thread first, then the thread, the TCP sockets, the server."""

from __future__ import annotations

import socket
from typing import Any, Protocol, Self

from rose_transfer.wire.loop_thread import LoopThread


class _Server(Protocol):
    def close(self) -> None: ...


class Listeners:
    def __init__(self, thread: LoopThread, server: _Server, *tcp: socket.socket) -> None:
        self.thread = thread
        self.server = server
        self.tcp = list(tcp)
        self.ucx: list[Any] = []
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for ucx in self.ucx:
            self.thread.loop.call_soon_threadsafe(ucx.close)
        self.thread.stop()
        for listener in self.tcp:
            listener.close()
        self.server.close()


class ServingEnd:
    """Base of a publisher or relay: closed with ``close`` or at the end of a ``with`` block."""

    _listeners: Listeners

    @property
    def _closed(self) -> bool:
        return self._listeners.closed

    def close(self) -> None:
        """Stop serving and drop every connection."""
        self._listeners.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
