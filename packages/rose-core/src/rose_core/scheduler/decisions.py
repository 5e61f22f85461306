"""What the elastic scheduler decides, as values the controller acts on: where a turn goes (``Assignment``),
which attempt to stop on a worker (``Cancellation``), which turn nothing will run (``GivenUp``), and what a
result is worth (``Verdict``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rose_core.scheduler.turn_ticket import TurnTicket

Verdict = Literal["accepted", "late", "duplicate", "unknown"]


@dataclass(slots=True, frozen=True)
class Assignment:
    ticket: TurnTicket
    worker_id: str
    reason: str
    """affinity | dedicated | borrowed | long_tail"""
    detail: str = ""
    """Why a long-tail move overrode affinity (``prefix cold on W`` / ``W holds turns, dedicated idle``)."""


@dataclass(slots=True, frozen=True)
class GivenUp:
    """A turn that failed on workers ``turn_retries + 1`` times, or on every worker there is: nothing runs it."""

    ticket: TurnTicket
    reason: str
    """Its last failure."""


@dataclass(slots=True, frozen=True)
class Cancellation:
    """A turn re-routed away from a worker that may still run it: tell ``worker_id`` to stop that attempt."""

    worker_id: str
    turn_id: str
    attempt: int
