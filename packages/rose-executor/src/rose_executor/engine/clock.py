"""The clock an engine stamps its requests with and the SLO guard reads ``now`` from.

``WallClock`` is vLLM's: ``time.monotonic()`` (the engine core's token stamps are system-wide monotonic on
Linux) and the running event loop's timers (asyncio's loop clock is ``time.monotonic()`` too).
``VirtualClock`` is the twin's: time that moves only when a test moves it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Call ``callback()`` once ``delay`` seconds of this clock have passed (on the event loop)."""
        ...


class WallClock:
    """``time.monotonic()`` and the running event loop's timers."""

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, callback)


WALL_CLOCK = WallClock()
