"""How a job plugs into the controller's loop (``ControlLoop``): four hooks the loop calls on its thread.

A hook returns at once: it records, submits turns, resolves the job's futures; it never waits (a wait inside
a hook raises ``NestedWait``). The RL job with built-in environments, the gateway job and a job whose trainer
is outside ROSE implement these (``rose_core.app.jobs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rose_core.protocol.messages import SamplingParams, StepStatus, TurnResult
from rose_core.scheduler import GivenUp, TurnTicket


@dataclass(slots=True)
class TurnPayload:
    """What a job attaches to a turn's ticket: the prompt, how to sample, the step it belongs to."""

    prompt_token_ids: np.ndarray
    sampling: SamplingParams
    step: int


@dataclass(slots=True)
class AcceptedTurn:
    """A turn's result the scheduler accepted (its latest attempt, from the executor running it)."""

    result: TurnResult
    ticket: TurnTicket
    role: str
    """The pool it ran in: dedicated or serving."""


@dataclass(slots=True)
class JobStatus:
    """What the status stream shows of the job: the step in progress and the steps done (oldest first)."""

    step: StepStatus | None = None
    history: tuple[StepStatus, ...] = ()


class JobHooks(Protocol):
    def on_result(self, accepted: AcceptedTurn) -> None:
        """A turn's accepted result."""

    def on_given_up(self, given_up: GivenUp) -> None:
        """A turn that failed on executors more often than ``scheduler.turn_retries`` allows: nothing will run
        it (drop its trajectory, fail the call waiting for it)."""

    def on_tick(self, now: float) -> None:
        """Every control tick, first (before routing): local work such as agents' calls to submit."""

    def status(self) -> JobStatus:
        """The job's progress, for the status stream."""


class NoJob:
    """The controller before a job attaches: results are dropped (nothing asked for them), nothing to show."""

    def on_result(self, accepted: AcceptedTurn) -> None:
        return None

    def on_given_up(self, given_up: GivenUp) -> None:
        return None

    def on_tick(self, now: float) -> None:
        return None

    def status(self) -> JobStatus:
        return JobStatus()
