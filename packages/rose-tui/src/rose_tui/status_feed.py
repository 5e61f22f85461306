"""The dashboard's session with the controller: ``Hello`` as an observer, then ``StatusSnapshot``s, each
acknowledged (``StatusAck``) as it is handed to the app, then ``Goodbye``. No Textual here: the app polls
``recv`` from a worker thread, so a dashboard that falls behind acks late and the controller sends it fewer,
newer snapshots (``rose_core.protocol.messages.STATUS_CREDIT``)."""

from __future__ import annotations

import secrets
import time
from typing import TypeAlias

from rose_core.protocol.messages import ErrorReport, Goodbye, Hello, StatusAck, StatusSnapshot, Welcome
from rose_core.transport.channel import ControlClient
from rose_tui import __version__

FeedMessage: TypeAlias = Welcome | StatusSnapshot | ErrorReport
GOODBYE_GRACE_S = 0.2
"""Time the channel's I/O thread gets to put ``Goodbye`` on the wire before the socket closes."""


def new_peer_id() -> str:
    return f"tui-{secrets.token_hex(4)}"


class StatusFeed:
    """An observer connected to a controller's control address."""

    def __init__(self, address: str, secret: bytes, peer_id: str | None = None, *, encrypt: bool = False) -> None:
        """``secret``: the observer key the dashboard signs with; ``encrypt``: the controller encrypts its control
        socket (`[controller] encrypt`), so connect over CurveZMQ with keys derived from that same key."""
        self.address = address
        self.peer_id = peer_id or new_peer_id()
        self._client = ControlClient(address, secret, peer_id=self.peer_id, encrypt_with=secret if encrypt else None)
        self._closed = False

    def hello(self) -> None:
        self._client.send(Hello(peer_id=self.peer_id, kind="observer", software=f"rose-tui {__version__}"))

    def recv(self, timeout: float) -> FeedMessage | None:
        """The next message meant for a dashboard, or ``None`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self._closed:
            got = self._client.recv(timeout=max(0.0, deadline - time.monotonic()))
            if got is None:
                return None
            msg = got[1]
            if isinstance(msg, StatusSnapshot):
                self._client.send(StatusAck(snapshot_time=msg.time))
            if isinstance(msg, Welcome | StatusSnapshot | ErrorReport):
                return msg
        return None

    def close(self, reason: str = "quit") -> None:
        """Say ``Goodbye`` and close the socket; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._client.send(Goodbye(peer_id=self.peer_id, reason=reason))
        time.sleep(GOODBYE_GRACE_S)
        self._client.close()

    @property
    def closed(self) -> bool:
        return self._closed
