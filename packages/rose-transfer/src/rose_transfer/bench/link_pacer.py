"""``LinkPacer``: a token bucket that models one slow link (e.g. the inter-cluster link into one
destination cluster) shared by every connection that crosses it, and counts the bytes it carried.

It is a ``wire.send_gate.SendGate``: connections given it await ``admit(n)`` before putting ``n``
bytes on the wire; with ``bytes_per_s`` None the link is unlimited and only counted. Lives on one
event loop (the sender's). ``open_link`` serves a publisher's versions through one."""

from __future__ import annotations

import asyncio
import time

from rose_core.support.errors import ConfigError
from rose_transfer.serve.publisher import DensePublisher
from rose_transfer.wire.send_gate import GATE_CHUNK_BYTES


class LinkPacer:
    def __init__(
        self, bytes_per_s: float | None = None, burst_bytes: int = GATE_CHUNK_BYTES, name: str = "link"
    ) -> None:
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ConfigError(f"link rate must be positive, got {bytes_per_s} bytes/s: omit it for an unlimited link")
        self.bytes_per_s = bytes_per_s
        self.burst_bytes = burst_bytes
        self.name = name
        self.carried = 0
        self._free_at = 0.0  # when the link has sent everything accepted so far

    @classmethod
    def from_gbps(cls, gbps: float | None, name: str = "link") -> LinkPacer:
        return cls(None if gbps is None else gbps * 1e9 / 8, name=name)

    async def admit(self, nbytes: int) -> None:
        self.carried += nbytes
        if self.bytes_per_s is None:
            return
        now = time.monotonic()
        self._free_at = max(self._free_at, now - self.burst_bytes / self.bytes_per_s) + nbytes / self.bytes_per_s
        if self._free_at > now:
            await asyncio.sleep(self._free_at - now)


def open_link(publisher: DensePublisher, pacer: LinkPacer, transport: str = "tcp") -> str:
    """Serve ``publisher``'s versions on a new listener (``tcp`` or ``ucx``) whose sends all pass
    through ``pacer`` (one slow link, e.g. into one destination cluster); returns its source."""
    if transport == "ucx":
        return publisher.open_ucx(gate=pacer)
    return publisher.open_tcp(gate=pacer)
