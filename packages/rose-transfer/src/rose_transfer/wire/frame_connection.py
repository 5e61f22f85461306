"""What the weight channel needs of a connection: ``FrameSocket`` (TCP) and ``UcxFrameSocket`` (UCX)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

REPLY_OVERHEAD = 1024 * 1024  # a bucket reply's bytes beyond the bucket: its message limit is bucket + this


class FrameConnection(Protocol):
    bytes_received: int
    bytes_sent: int

    async def send(self, frames: Sequence[Any]) -> None: ...

    async def recv(
        self, max_bytes: int, bulk_into: memoryview | None = None, idle_timeout: float | None = None
    ) -> list[Any]: ...

    def close(self) -> None: ...
