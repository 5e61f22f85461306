"""The rollout engine's memory, shared by the guard and the weight updater: a release and a hold never
overlap, and nothing is released while a hold is taken (an update never commits into released memory)."""

from __future__ import annotations

import asyncio

from rose_executor.rollout.engine_memory import EngineMemory


class SlowSleeper:
    """An engine whose release and restore take a while (a GPU's sleep and wake-up), recording the order."""

    can_release_memory = True

    def __init__(self) -> None:
        self.released = False
        self.calls: list[str] = []

    async def release_memory(self) -> None:
        self.calls.append("release start")
        await asyncio.sleep(0.05)
        self.released = True
        self.calls.append("release end")

    async def restore_memory(self) -> None:
        self.calls.append("restore start")
        await asyncio.sleep(0.05)
        self.released = False
        self.calls.append("restore end")


async def test_a_hold_taken_during_a_release_waits_for_it_then_restores() -> None:
    engine = SlowSleeper()
    memory = EngineMemory(engine)  # type: ignore[arg-type]
    releasing = asyncio.create_task(memory.release())
    await asyncio.sleep(0.01)  # the release is under way
    async with memory.hold():
        assert not engine.released and not memory.released  # the update runs on restored memory
        engine.calls.append("update")
        assert await memory.release() is False  # the guard ticks mid-update: refused
    assert await releasing is True
    assert engine.calls == ["release start", "release end", "restore start", "restore end", "update"]
    assert memory.restores == 1 and await memory.release() is True  # no hold left: released again


async def test_an_engine_that_cannot_release_is_never_asked_to() -> None:
    engine = SlowSleeper()
    engine.can_release_memory = False
    memory = EngineMemory(engine)  # type: ignore[arg-type]
    assert await memory.release() is False and await memory.restore() is False and engine.calls == []
