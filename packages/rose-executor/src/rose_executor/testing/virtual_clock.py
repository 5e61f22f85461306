"""Time that moves only when a test moves it: the clock of the in-process twins (``FakeEngine``), so tests of
the guard and the runner run the real code in one process, deterministically, without sleeping.

``now()`` reads it; ``call_later`` schedules a callback; ``await advance(dt)`` runs every callback due up to
``now + dt`` in time order (ties in scheduling order), setting ``now`` to each one's time and letting the event
loop run after each (so the coroutines a callback wakes can schedule the next), and ends at ``now + dt``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

SETTLE_ROUNDS = 50
"""Event-loop turns given after each callback: enough for a woken coroutine chain to reach its next await."""


@dataclass(order=True, slots=True)
class VirtualTimer:
    when: float
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """A test's clock: starts at ``start`` seconds and moves only in ``advance`` / ``run_until``."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._timers: list[VirtualTimer] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> VirtualTimer:
        timer = VirtualTimer(self._now + max(0.0, delay), next(self._seq), callback)
        heapq.heappush(self._timers, timer)
        return timer

    @property
    def next_due(self) -> float | None:
        """When the next pending callback is due; None when nothing is scheduled."""
        self._drop_cancelled()
        return self._timers[0].when if self._timers else None

    async def advance(self, seconds: float) -> None:
        """Move ``seconds`` forward, running every callback due on the way."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back (advance {seconds})")
        target = self._now + seconds
        await settle()
        while (due := self.next_due) is not None and due <= target:
            self._fire(heapq.heappop(self._timers))
            await settle()
        self._now = target
        await settle()

    async def run_until(self, condition: Callable[[], bool], timeout_s: float = 3600.0) -> None:
        """Run callback after callback until ``condition()`` holds; ``TimeoutError`` when ``timeout_s`` of this
        clock pass first or nothing is left to run."""
        deadline = self._now + timeout_s
        await settle()
        while not condition():
            due = self.next_due
            if due is None or due > deadline:
                raise TimeoutError(f"condition not met by t={self._now:.6f} (nothing due before {deadline:.6f})")
            self._fire(heapq.heappop(self._timers))
            await settle()

    def _fire(self, timer: VirtualTimer) -> None:
        self._now = max(self._now, timer.when)
        timer.callback()

    def _drop_cancelled(self) -> None:
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)


async def settle(rounds: int = SETTLE_ROUNDS) -> None:
    """Let the event loop run ``rounds`` turns (what is ready runs; nothing waits on time)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
