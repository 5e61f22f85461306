"""The controller's side of the control channel, played by a test over a real ``ControlServer``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from rose_core.channel import ControlServer
from rose_core.messages import Heartbeat

M = TypeVar("M")


class ControllerPeer:
    """Receives what an executor sends (keeping what no test asked for yet); sends to the last peer heard from."""

    def __init__(self, secret: bytes) -> None:
        self.server = ControlServer("tcp://127.0.0.1:0", secret)
        self.address = self.server.address
        self.peer = b""
        self.heartbeats: list[Heartbeat] = []
        self.backlog: list[Any] = []

    def expect(self, kind: type[M], timeout: float = 30.0, where: Callable[[M], bool] = lambda _: True) -> M:
        """The first message of ``kind`` matching ``where`` (already received or arriving within ``timeout``).

        Heartbeats are only ever matched as they arrive (a test asking for one wants a fresh one).
        """
        for msg in self.backlog:
            if isinstance(msg, kind) and where(msg):
                self.backlog.remove(msg)
                return msg
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            msg = self._next(min(left, 0.5))
            if isinstance(msg, kind) and where(msg):
                return msg
            if msg is not None and not isinstance(msg, Heartbeat):
                self.backlog.append(msg)
        recent = [type(m).__name__ for m in self.backlog[-8:]]
        raise AssertionError(f"no {kind.__name__} within {timeout:g} s (unclaimed: {recent})")

    def quiet_for(self, seconds: float, where: Callable[[Any], bool]) -> None:
        """Assert that nothing matching ``where`` arrives for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            msg = self._next(min(left, 0.2))
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
