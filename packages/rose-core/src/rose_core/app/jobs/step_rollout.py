"""One step's rollout in progress: its episodes (or the gateway's closed sessions), which are still open, the
version window its turns run in, and what the step report counts of it."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from rose_core.app.controller.job_hooks import AcceptedTurn
from rose_core.app.rl.algorithm.trajectory import Trajectory
from rose_core.app.rl.environments.episode import Episode


@dataclass(slots=True)
class StepRollout:
    step: int
    version: int
    """The newest weights when it started."""
    window: tuple[int, int]
    """The versions its turns may run on."""
    episodes: dict[str, Episode] = field(default_factory=dict)
    open: set[str] = field(default_factory=set)
    sessions: list[Trajectory] = field(default_factory=list)
    """The gateway's sessions this step trains on (closed by their agents; ``rose_core.app.jobs.gateway_job``)."""
    evals: set[str] = field(default_factory=set)
    """Held-out episodes played greedily (reported, never trained)."""
    groups: int = 0
    """Training groups started (the refill's next group index)."""
    members: dict[str, list[str]] = field(default_factory=dict)
    """Training group id -> its episodes' trajectory ids."""
    settled: set[str] = field(default_factory=set)
    """Training groups none of whose episodes is still open (offered to an external trainer as they settle)."""
    dropped: int = 0
    turn_counts: dict[str, int] = field(default_factory=dict)
    by_role: dict[str, int] = field(default_factory=lambda: {"dedicated": 0, "serving": 0})
    failed: int = 0
    """Trajectories dropped: a turn of theirs was given up (``RLJob.on_given_up``)."""
    complete: Future[None] = field(default_factory=Future)
    """Done once the rollout has what its step trains on (``check_complete``; a refill starts a new one)."""

    def finished(self, *, evals: bool = False) -> list[Trajectory]:
        """Done trajectories: the training ones, or the evaluation ones."""
        played = [ep.trajectory for tid, ep in self.episodes.items() if ep.done and (tid in self.evals) == evals]
        return played if evals else played + self.sessions

    def settle(self, group_id: str) -> list[Trajectory] | None:
        """Once, when training group ``group_id`` has no episode left open: its done trajectories (those it
        trains on: a dropped one is not done); None before, after, and for evaluation groups."""
        tids = self.members.get(group_id)
        if tids is None or group_id in self.settled or any(tid in self.open for tid in tids):
            return None
        self.settled.add(group_id)
        return [self.episodes[tid].trajectory for tid in tids if self.episodes[tid].done]

    def count(self, accepted: AcceptedTurn) -> None:
        """An accepted turn of this rollout, by pool (the controller refused it had it run outside its window)."""
        self.by_role[accepted.role] = self.by_role.get(accepted.role, 0) + 1

    def check_complete(self, complete: bool) -> None:
        """Resolve ``complete`` when ``complete`` (the job's rule) first holds."""
        if complete and not self.complete.done():
            self.complete.set_result(None)

    def reopen(self) -> None:
        """More turns to wait for (a refill): a new ``complete``."""
        if self.complete.done():
            self.complete = Future()
