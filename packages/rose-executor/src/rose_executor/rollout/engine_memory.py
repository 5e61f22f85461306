"""The rollout engine's device memory: released while the policy sits inactive (vLLM's sleep mode on a GPU),
restored before anything runs on it, and held restored by whoever needs it (a weight update).

One object shared by the co-serving guard (which releases it when the policy goes inactive and restores it
when turns arrive) and the weight updater (which holds it while it stages and commits a version), instead of
each reaching into the other.

Invariant: ``release`` and ``restore`` run one at a time (one lock), and nothing releases while a hold is
taken: a hold taken while a release is under way waits for that release to finish, then restores. So a
weight update never writes into released (unmapped) memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from rose_executor import metrics
from rose_executor.engine.bounded_call import bounded
from rose_executor.engine.engine_protocol import Engine

log = logging.getLogger(__name__)


class EngineMemory:
    def __init__(self, engine: Engine, call_timeout_s: float = 60.0) -> None:
        """``call_timeout_s``: how long a release or restore may take before the engine counts as hung."""
        self.engine = engine
        self.call_timeout_s = call_timeout_s
        self.released = False
        """The engine's memory is released (GPU sleep mode; never on CPU, where engines cannot release)."""
        self.restores = 0
        """How many times it was restored: a restore resumes the engine's scheduling, so whoever keeps it paused
        (the guard) pauses it again when this changed."""
        self._holds = 0
        self._lock = asyncio.Lock()

    @property
    def held(self) -> bool:
        return self._holds > 0

    async def release(self) -> bool:
        """Release the engine's memory where the platform can and nobody holds it; True when released now."""
        if not self.engine.can_release_memory or self.released or self.held:
            return False
        async with self._lock:
            if self.released or self.held:
                return False
            await bounded(self.engine.release_memory(), self.call_timeout_s, "release its memory")
            self.released = True
        metrics.ROLLOUT_MEMORY_RELEASED.set(1)
        return True

    async def restore(self) -> bool:
        """Give a released engine its memory back (True when it was released); the engine then runs (vLLM's
        wake-up resumes scheduling), so whoever pauses it must pause it again."""
        async with self._lock:
            if not self.released:
                return False
            started = time.perf_counter()
            await bounded(self.engine.restore_memory(), self.call_timeout_s, "restore its memory")
            self.released = False
            self.restores += 1
        seconds = time.perf_counter() - started
        metrics.ROLLOUT_RESTORE_SECONDS.observe(seconds)
        metrics.ROLLOUT_MEMORY_RELEASED.set(0)
        log.info("rollout engine woken from released memory in %.2f s", seconds)
        return True

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """The engine's memory restored and kept so until the block ends (a weight update's stage and commit)."""
        self._holds += 1
        try:
            await self.restore()
            yield
        finally:
            self._holds -= 1
