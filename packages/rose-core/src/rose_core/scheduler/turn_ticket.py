"""A turn waiting for, or running on, a worker: the scheduler's unit of work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class TurnTicket:
    turn_id: str
    trajectory_id: str
    min_version: int
    max_version: int
    first_queued_at: float
    attempt: int = 0
    payload: Any = None
    """Opaque to the scheduler (the controller keeps the prompt here)."""
    avoid: str = ""
    """A worker that just refused this turn for lack of room (memory, capacity): not picked for it until
    ``avoid_until`` (warm affinity would send it straight back; after that it may be tried again, so a turn
    with a single possible worker is delayed, never starved)."""
    avoid_until: float = 0.0
    failed_on: tuple[str, ...] = ()
    """Workers this turn failed on (an engine error, a refused result), in order: never offered it again."""
