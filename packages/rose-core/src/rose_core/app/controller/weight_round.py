"""One weight version on its way to the executors: announced to each, done when each has applied it, failed
to, stalled or left. A stalled executor is not waited for: it holds the old version, gets no turn outside
its window, and takes the next version when it is back.

``future`` resolves (on the controller's loop) with each answering executor's ``WeightApplied``; ``breakdown``
then says where the seconds went (``weight_sync``).
"""

from __future__ import annotations

from concurrent.futures import Future

from rose_core.app.controller.executor_record import ExecutorRecord
from rose_core.app.controller.weight_sync import ExecutorSync, SyncBreakdown
from rose_core.protocol.messages import WeightAnnounce, WeightApplied


class WeightRound:
    def __init__(self, announce: WeightAnnounce, sent_at: dict[str, float], started: float,
                 executors: dict[str, ExecutorRecord], *, publish_s: float = 0.0, export_s: float = 0.0) -> None:
        """``sent_at``: when the announce went to each target (controller clock); ``publish_s`` (of which
        ``export_s`` is the trainer's export): what the caller spent making the version fetchable first."""
        self.announce = announce
        self.sent_at = sent_at
        self.started = started
        self.executors = executors
        self.publish_s = publish_s
        self.export_s = export_s
        self.future: Future[dict[str, WeightApplied]] = Future()
        self.breakdown = SyncBreakdown()

    @property
    def version(self) -> int:
        return self.announce.version

    def answers(self) -> dict[str, WeightApplied]:
        return {eid: rec.applied[self.version] for eid, rec in self.executors.items() if self.version in rec.applied}

    def pending(self) -> list[str]:
        done = self.answers()
        return [eid for eid in self.sent_at
                if eid in self.executors and eid not in done and self.executors[eid].state != "stalled"]

    def settle(self, now: float) -> bool:
        """Resolve the future once nobody is pending (True, once)."""
        if self.future.done() or self.pending():
            return False
        done = self.answers()
        parts = {eid: ExecutorSync.of(a, self.executors[eid].applied_at[self.version] - self.sent_at[eid],
                                      self.announce.manifest_digest)
                 for eid, a in done.items() if eid in self.sent_at}
        self.breakdown = SyncBreakdown.of(parts, publish_s=self.publish_s, export_s=self.export_s,
                                          announce_s=now - self.started)
        self.future.set_result(done)
        return True

    def timed_out(self) -> TimeoutError:
        """What a wait for this round raises when it runs out of time."""
        return TimeoutError(f"executors {self.pending()} did not apply weight version {self.version} in time "
                            "(rl.weight_sync_timeout_s)")
