"""The simulator's side of one rollout worker: what runs on it and how fast it goes."""

from __future__ import annotations

from dataclasses import dataclass, field

from rose_core.app.sim.harvest_curve import HarvestCurve
from rose_core.policy import ServingFirstMemory


@dataclass(slots=True)
class RunningTurn:
    trajectory_id: str
    attempt: int
    started_at: float
    kv_bytes: int


@dataclass(slots=True)
class SimWorker:
    worker_id: str
    kind: str
    """dedicated | borrowed | spot | serverless"""
    curve: HarvestCurve | None = None
    offset: float = 0.0
    serving_class: int = -1
    memory: ServingFirstMemory | None = None
    alive: bool = True
    running: dict[str, RunningTurn] = field(default_factory=dict)
    overhead_s: float = 0.0
    generation: int = 0
    """Bumped whenever the worker leaves, so its pending lifecycle events become stale."""

    def finish_time(self, now: float, work_s: float) -> float:
        if self.curve is None:
            return now + work_s
        return self.curve.finish_time(now + self.offset, work_s) - self.offset
