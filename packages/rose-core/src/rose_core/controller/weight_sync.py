"""Where the seconds of one weight sync went: the controller's side (publish, its wait for each executor)
put together with what each executor reports in ``WeightApplied``.

Per executor the parts add up: ``transfer_s + apply_s + wait_s == elapsed_s``, the controller's time from
sending the announce to handling that executor's ``WeightApplied``; ``wait_s`` is what the executor's own
clock does not account for (announce delivery, its queue before the fetch starts, the reply's way back,
the controller's pump). The step's ``transfer_s``, ``apply_s`` and ``wait_s`` are each the max over the
executors, and ``publish_s + announce_s`` is the controller's whole sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rose_core.messages import WeightApplied


@dataclass(slots=True)
class ExecutorSync:
    """One executor's part of a sync (seconds; the executor's clock except ``elapsed_s`` and ``wait_s``)."""

    bytes_received: int = 0
    elapsed_s: float = 0.0
    """Controller clock: announce sent to this executor -> its ``WeightApplied`` handled."""
    transfer_s: float = 0.0
    apply_s: float = 0.0
    wait_s: float = 0.0
    """``elapsed_s - transfer_s - apply_s`` (never below 0); ``queue_s`` is the part of it seen by the executor."""
    queue_s: float = 0.0
    abort_s: float = 0.0
    pause_s: float = 0.0
    reload_s: float = 0.0
    resume_s: float = 0.0
    aborted_turns: int = 0

    @classmethod
    def of(cls, applied: WeightApplied, elapsed_s: float) -> ExecutorSync:
        own = applied.transfer_seconds + applied.apply_seconds
        return cls(
            bytes_received=applied.bytes_received,
            elapsed_s=elapsed_s,
            transfer_s=applied.transfer_seconds,
            apply_s=applied.apply_seconds,
            wait_s=max(0.0, elapsed_s - own),
            queue_s=applied.queue_seconds,
            abort_s=applied.abort_seconds,
            pause_s=applied.pause_seconds,
            reload_s=applied.reload_seconds,
            resume_s=applied.resume_seconds,
            aborted_turns=applied.aborted_turns,
        )


@dataclass(slots=True)
class SyncBreakdown:
    """One weight version's sync, as the step report and the status stream carry it."""

    publish_s: float = 0.0
    """Controller side, before the announce: the trainer's export and ``publisher.publish``."""
    export_s: float = 0.0
    """The trainer's export, part of ``publish_s``."""
    announce_s: float = 0.0
    """Controller clock: first announce sent -> the last executor's ``WeightApplied`` handled."""
    transfer_s: float = 0.0
    apply_s: float = 0.0
    wait_s: float = 0.0
    last: str = ""
    """The executor whose ``WeightApplied`` came last (its parts make up ``announce_s``)."""
    executors: dict[str, ExecutorSync] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.publish_s + self.announce_s

    @classmethod
    def of(
        cls, executors: dict[str, ExecutorSync], *, publish_s: float, export_s: float, announce_s: float
    ) -> SyncBreakdown:
        parts = executors.values()
        return cls(
            publish_s=publish_s,
            export_s=export_s,
            announce_s=announce_s,
            transfer_s=max((e.transfer_s for e in parts), default=0.0),
            apply_s=max((e.apply_s for e in parts), default=0.0),
            wait_s=max((e.wait_s for e in parts), default=0.0),
            last=max(executors, key=lambda eid: executors[eid].elapsed_s, default=""),
            executors=executors,
        )
