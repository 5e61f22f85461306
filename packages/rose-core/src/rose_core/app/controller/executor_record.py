"""The controller's record of one registered executor."""

from __future__ import annotations

from dataclasses import dataclass, field

from rose_core.protocol.messages import ExecutorStatus, LoadReport, Register, WeightApplied


@dataclass(slots=True)
class ExecutorRecord:
    peer: bytes
    info: Register
    registered_at: float
    last_seen: float
    load: LoadReport = field(default_factory=LoadReport)
    state: str = "ready"
    weight_version: int = 0
    applied: dict[int, WeightApplied] = field(default_factory=dict)
    applied_at: dict[int, float] = field(default_factory=dict)
    """Controller clock when each ``WeightApplied`` was handled (the end of that executor's sync)."""
    turns_done: int = 0
    heartbeats: int = 0
    revoked: bool = False

    @property
    def executor_id(self) -> str:
        return self.info.executor_id

    @property
    def role(self) -> str:
        return self.info.role

    def status(self, now: float, borrowed: bool = False, routed: dict[str, int] | None = None) -> ExecutorStatus:
        return ExecutorStatus(
            executor_id=self.executor_id,
            role=self.info.role,
            state=self.state,
            weight_version=self.weight_version,
            load=self.load,
            turns_done=self.turns_done,
            last_seen_s=max(0.0, now - self.last_seen),
            borrowed=borrowed,
            routed=dict(routed or {}),
        )
