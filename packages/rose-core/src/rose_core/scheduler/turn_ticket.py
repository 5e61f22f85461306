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
