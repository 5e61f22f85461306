"""Device time of one engine: the CPU seconds of its worker processes.

vLLM's CPU backend runs each engine's model steps in worker processes (named ``VLLM::Worker``) pinned to the
cores they compute on (here both engines' workers on core 0), so a worker's CPU time is the device time its
engine used; the engine-core and front-end processes (scheduling, I/O) are not counted. The bench reads it
around each window to say how much of the device serving needs at a load and what the rollout got.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil

WORKER_NAME = "VLLM::Worker"


def descendants() -> set[int]:
    """Process ids of this process's descendants now (call before starting an engine)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


class WorkerCpu:
    """CPU seconds (user + system) of one engine's worker processes."""

    def __init__(self, processes: Iterable[psutil.Process]) -> None:
        self._processes = list(processes)

    @classmethod
    def spawned_since(cls, before: set[int]) -> WorkerCpu:
        """The workers of the engine started since ``before`` (``descendants()`` taken just before it)."""
        new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and _is_worker(p)]
        if not new:
            raise RuntimeError(f"no {WORKER_NAME} process started with the engine: cannot measure its device time")
        return cls(new)

    def cores(self) -> set[int]:
        """The cores the workers may run on (their CPU affinity): the device."""
        cores: set[int] = set()
        for p in self._processes:
            try:
                cores.update(p.cpu_affinity() or [])
            except psutil.NoSuchProcess:
                continue
        return cores or {0}

    def batch_scheduled(self) -> int:
        """Put every thread of the workers under ``SCHED_BATCH`` (no wakeup preemption: a worker that wakes
        waits for the running one's time slice, as work queued on a time-sliced GPU does, instead of taking
        the core at once as CFS gives a sleeper); returns the threads changed."""
        changed = 0
        for p in self._processes:
            try:
                threads = p.threads()
            except psutil.NoSuchProcess:
                continue
            for thread in threads:
                try:
                    os.sched_setscheduler(thread.id, os.SCHED_BATCH, os.sched_param(0))
                except ProcessLookupError:
                    continue
                changed += 1
        return changed

    def seconds(self) -> float:
        total = 0.0
        for p in self._processes:
            try:
                times = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total


def _is_worker(p: psutil.Process) -> bool:
    try:
        return bool(p.name() == WORKER_NAME)
    except psutil.NoSuchProcess:
        return False
