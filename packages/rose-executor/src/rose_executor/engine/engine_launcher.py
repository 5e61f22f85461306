"""How the agent gets its engines: an ``EngineLauncher`` starts one engine per ``EngineSpec``.

``VllmLauncher`` is the real one: it imports vllm off the event loop (the import takes seconds), starts a
``VllmEngine`` and has an ``OrphanGuard`` watch the engine-core processes it spawned. Tests hand the agent
``FakeEngineLauncher`` (``fake_engine``) instead.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Protocol

from rose_executor.engine.engine_protocol import Engine
from rose_executor.engine.engine_spec import EngineSpec
from rose_executor.host.orphan_guard import OrphanGuard


class EngineLauncher(Protocol):
    async def start(self, spec: EngineSpec) -> Engine: ...

    def close(self) -> None:
        """After every engine it started is shut down: release what the launcher holds."""
        ...


class VllmLauncher:
    """Starts ``VllmEngine``s and watches their processes (stopped even if the executor dies hard)."""

    def __init__(self) -> None:
        self._orphan_guard: OrphanGuard | None = None

    async def start(self, spec: EngineSpec) -> Engine:
        await asyncio.to_thread(importlib.import_module, "rose_executor.engine.vllm_engine")
        from rose_executor.engine.vllm_engine import VllmEngine

        if self._orphan_guard is None:
            self._orphan_guard = OrphanGuard()
        engine = await VllmEngine.start(spec)
        self._orphan_guard.watch_children()
        return engine

    def close(self) -> None:
        if self._orphan_guard is not None:
            self._orphan_guard.close()
            self._orphan_guard = None
