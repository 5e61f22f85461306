"""The controller's side of the control channel, played by a test: over a real ``ControlServer`` (an executor
in its own process; ``expect`` blocks) or over the in-process twin ``InProcessServer`` (an agent on this event
loop; ``arrival`` awaits)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from rose_core.protocol.messages import Heartbeat
from rose_core.transport.channel import ControlServer
from rose_core.transport.control_endpoint import ServerEndpoint

M = TypeVar("M")


class ControllerPeer:
    """Receives what an executor sends (keeping what no test asked for yet); sends to the last peer heard from."""

    def __init__(self, secret: bytes, server: ServerEndpoint | None = None) -> None:
        self.server: ServerEndpoint = server or ControlServer("tcp://127.0.0.1:0", secret)
        self.address = self.server.address
        self.peer = b""
        self.heartbeats: list[Heartbeat] = []
        self.backlog: list[Any] = []

    def expect(self, kind: type[M], timeout: float = 30.0, where: Callable[[M], bool] = lambda _: True) -> M:
        """The first message of ``kind`` matching ``where`` (already received or arriving within ``timeout``).

        Heartbeats are only ever matched as they arrive (a test asking for one wants a fresh one).
        """
        if (claimed := self._claim(kind, where)) is not None:
            return claimed
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if (msg := self._match(self._next(min(left, 0.5)), kind, where)) is not None:
                return msg
        raise self._missing(kind, timeout)

    async def arrival(self, kind: type[M], timeout: float = 30.0, where: Callable[[M], bool] = lambda _: True) -> M:
        """``expect`` for an agent on this event loop: polls without blocking the loop."""
        if (claimed := self._claim(kind, where)) is not None:
            return claimed
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while (got := self._next(0)) is not None:
                if (msg := self._match(got, kind, where)) is not None:
                    return msg
            await asyncio.sleep(0.005)
        raise self._missing(kind, timeout)

    def _claim(self, kind: type[M], where: Callable[[M], bool]) -> M | None:
        for msg in self.backlog:
            if isinstance(msg, kind) and where(msg):
                self.backlog.remove(msg)
                return msg
        return None

    def _match(self, msg: Any, kind: type[M], where: Callable[[M], bool]) -> M | None:
        if isinstance(msg, kind) and where(msg):
            return msg
        if msg is not None and not isinstance(msg, Heartbeat):
            self.backlog.append(msg)
        return None

    def _missing(self, kind: type, timeout: float) -> AssertionError:
        recent = [type(m).__name__ for m in self.backlog[-8:]]
        return AssertionError(f"no {kind.__name__} within {timeout:g} s (unclaimed: {recent})")

    def quiet_for(self, seconds: float, where: Callable[[Any], bool]) -> None:
        """Assert that nothing matching ``where`` arrives for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._refuse(self._next(min(left, 0.2)), where)

    async def quiet(self, seconds: float, where: Callable[[Any], bool]) -> None:
        """``quiet_for`` for an agent on this event loop."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            while (got := self._next(0)) is not None:
                self._refuse(got, where)
            await asyncio.sleep(0.005)

    def _refuse(self, msg: Any, where: Callable[[Any], bool]) -> None:
        if msg is not None and where(msg):
            raise AssertionError(f"unexpected {msg!r}")
        if msg is not None and not isinstance(msg, Heartbeat):
            self.backlog.append(msg)

    def _next(self, timeout: float) -> Any | None:
        got = self.server.recv(timeout=timeout)
        if got is None:
            return None
        self.peer, msg = got
        if isinstance(msg, Heartbeat):
            self.heartbeats.append(msg)
        return msg

    def send(self, msg: msgspec.Struct) -> None:
        self.server.send(self.peer, msg)

    def close(self) -> None:
        self.server.close()
