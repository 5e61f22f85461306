"""The status stream's messages (controller -> dashboards): snapshots of executors and steps, and the
observer's acknowledgement that paces them. Rules: ``rose_core.protocol.messages``."""

from __future__ import annotations

import msgspec

from rose_core.protocol.control_messages import LoadReport
from rose_core.protocol.message_base import Message, Role

# ---------------------------------------------------------------- status stream for dashboards


class ExecutorStatus(msgspec.Struct, kw_only=True):
    executor_id: str
    role: Role
    state: str
    weight_version: int
    load: LoadReport
    turns_done: int = 0
    last_seen_s: float = 0.0
    borrowed: bool = False
    """A serving executor this job borrowed (dedicated: always False)."""
    routed: dict[str, int] = {}
    """Turns the scheduler routed here, by reason (affinity, dedicated, borrowed, long_tail)."""


class StepStatus(msgspec.Struct, kw_only=True):
    step: int
    phase: str
    weight_version: int
    trajectories_total: int
    trajectories_done: int
    turns_in_flight: int
    turns_queued: int
    reward_mean: float | None = None
    success_rate: float | None = None
    """Of this step's trajectories, the fraction that reached the goal (set when the step is done)."""
    eval_success: float | None = None
    """Greedy success on the held-out maps, on a step that evaluated (``rl.eval.every``)."""
    rollout_seconds: float = 0.0
    train_seconds: float = 0.0
    sync_seconds: float = 0.0


class StatusSnapshot(Message, tag="status"):
    controller_id: str
    time: float
    executors: list[ExecutorStatus]
    step: StepStatus | None
    slo_ttft_ms: float
    slo_tpot_ms: float
    weight_sync_seconds: float = 0.0
    weight_sync_bytes: int = 0
    history: list[StepStatus] = []
    finished: bool = False
    started_at: float = 0.0
    """Wall-clock time (epoch seconds) the controller started; ``time - started_at`` is the run's age."""
    weight_sync_publish_seconds: float = 0.0
    """The last sync's parts (``weight_sync_seconds`` is their whole): trainer export and publish, then the
    slowest executor's (max over executors) transfer, apply and wait; see ``docs/controller.md``."""
    weight_sync_transfer_seconds: float = 0.0
    weight_sync_apply_seconds: float = 0.0
    weight_sync_wait_seconds: float = 0.0


class StatusAck(Message, tag="status_ack"):
    """An observer handled the ``StatusSnapshot`` of this ``time``. The controller sends an observer a snapshot
    only while fewer than ``STATUS_CREDIT`` are unacknowledged, so a slow or stopped dashboard holds at most
    that many and gets the newest when it acks again: status is coalesced, the newest snapshot wins."""

    snapshot_time: float


STATUS_CREDIT = 2
"""Snapshots an observer may hold unacknowledged (one on the wire while it renders the other)."""
