"""What one simulated run of one system measured, step by step."""

from __future__ import annotations

from dataclasses import dataclass, field

from rose_core.app.sim.workload import Trajectory


@dataclass(slots=True)
class BatchRecord:
    launched_at: float
    trajectories: int
    rollout_end: float = -1.0
    trained_at: float = -1.0
    done_times: list[float] = field(default_factory=list)
    tokens: int = 0

    @property
    def rollout_s(self) -> float:
        return self.rollout_end - self.launched_at

    def p75_fraction(self) -> float:
        """When 75% of the trajectories were done, as a fraction of the step's rollout time."""
        if not self.done_times or self.rollout_s <= 0:
            return 0.0
        times = sorted(self.done_times)
        return (times[int(0.75 * (len(times) - 1))] - self.launched_at) / self.rollout_s


@dataclass(slots=True)
class RunRecord:
    system: str
    algorithm: str
    batch_size: int
    batches: dict[int, BatchRecord] = field(default_factory=dict)
    steps: int = 0
    end_time: float = 0.0
    overhead_s: float = 0.0
    remote_sync_s: float = 0.0
    """Cross-cluster link time of every weight version sent to the elastic GPUs."""
    memory_cuts: int = 0
    revocations: int = 0
    prefill_tokens: int = 0
    borrowed: list[tuple[int, float]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)

    def begin_batch(self, batch: int, now: float, trajectories: int) -> None:
        self.batches[batch] = BatchRecord(now, trajectories)

    def trajectory_done(self, traj: Trajectory, now: float) -> None:
        rec = self.batches[traj.batch]
        rec.done_times.append(now)
        rec.tokens += traj.context_tokens

    def end_batch_rollout(self, batch: int, now: float) -> None:
        self.batches[batch].rollout_end = now

    def end_batch_training(self, batch: int, now: float) -> None:
        self.batches[batch].trained_at = now
        self.steps += 1

    def training_tokens(self, batch: int) -> int:
        """The trained batch: ``batch_size`` trajectories (DAPO trains on the kept groups only)."""
        rec = self.batches[batch]
        return int(rec.tokens / max(1, rec.trajectories) * self.batch_size)
