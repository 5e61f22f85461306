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

from rose_core.protocol.messages import WeightApplied


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
    drain_s: float = 0.0
    """Running turns finishing on the old version (overlaps ``transfer_s``)."""
    commit_s: float = 0.0
    """Part of ``apply_s``: the version written into the engine's parameters in place."""
    retransform_s: float = 0.0
    """Part of ``apply_s``: the engine's transforms of the changed weights redone."""
    aborted_turns: int = 0
    full_sync: bool = False
    tensors_changed: int = 0
    digest_ok: bool = True
    """The engine's reported weights digest equals the announced one (bit-exact with the trainer)."""

    @classmethod
    def of(cls, applied: WeightApplied, elapsed_s: float, digest: str) -> ExecutorSync:
        """``digest``: the announced version's manifest digest (what the trainer published)."""
        own = applied.transfer_seconds + applied.apply_seconds
        return cls(
            bytes_received=applied.bytes_received,
            elapsed_s=elapsed_s,
            transfer_s=applied.transfer_seconds,
            apply_s=applied.apply_seconds,
            wait_s=max(0.0, elapsed_s - own),
            queue_s=applied.queue_seconds,
            drain_s=applied.drain_seconds,
            commit_s=applied.commit_seconds,
            retransform_s=applied.retransform_seconds,
            aborted_turns=applied.aborted_turns,
            full_sync=applied.full_sync,
            tensors_changed=applied.tensors_changed,
            digest_ok=applied.weights_digest == digest,
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
    digest_mismatches: int = 0
    """Executors whose engine reported weights other than the announced version's (0 when bit-exact)."""
    full_syncs: int = 0
    """Executors that took the version whole (no base to patch)."""
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
            digest_mismatches=sum(not e.digest_ok for e in parts),
            full_syncs=sum(e.full_sync for e in parts),
            last=max(executors, key=lambda eid: executors[eid].elapsed_s, default=""),
            executors=executors,
        )
