"""What the scheduler knows about one rollout worker (an executor's rollout engine)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

Pool = Literal["dedicated", "serving"]
WorkerHealth = Literal["ready", "stalled", "gone"]


@dataclass(slots=True)
class WorkerState:
    worker_id: str
    pool: Pool
    capacity: int
    weight_version: int
    last_seen: float
    health: WorkerHealth = "ready"
    borrowed: bool = False
    revoked: bool = False
    """Its serving owner took it back: never borrowed again by this job."""
    slo_headroom: bool = True
    budget_frozen: bool = False
    kv_usage_ratio: float = 0.0
    held: int = 0
    """Turns it holds back (its SLO guard has not released them), as its last heartbeat said."""
    held_since: float | None = None
    """Since when its heartbeats have said it holds turns back without a break (None: it holds none)."""
    warm: set[str] = field(default_factory=set)
    """Trajectories whose prefix KV it holds: its heartbeat's ``warm_trajectories``, plus every trajectory
    whose turn finished here since."""
    routed: Counter[str] = field(default_factory=Counter)
    """Turns routed here, by reason."""
    in_flight: dict[str, int] = field(default_factory=dict)
    """turn_id -> attempt currently running here."""
    turns_done: int = 0

    @property
    def load(self) -> int:
        return len(self.in_flight)

    def has_capacity(self) -> bool:
        return len(self.in_flight) < self.capacity

    def usable(self) -> bool:
        """May take new turns now (ignoring versions)."""
        if self.health != "ready" or not self.has_capacity():
            return False
        if self.pool == "serving":
            return self.borrowed and self.slo_headroom and not self.budget_frozen
        return True

    def holds(self, min_version: int, max_version: int) -> bool:
        return min_version <= self.weight_version <= max_version
