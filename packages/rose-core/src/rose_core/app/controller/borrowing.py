"""Which serving executors the job borrows, and when they are taken back.

Paper: at job start, borrow the N_serving serving GPUs with the lowest recent KV use, at most one RL job per
serving GPU. Here: once the job opens borrowing, each serving executor's load is watched for
``scheduler.borrow_after_s`` (from the opening, or from its registration if it joined later), then the
least loaded are borrowed into the free slots (``scheduler.max_borrowed_workers``). A serving executor whose
owner revoked it gives its turns back (re-routed, cancelled there) and is never borrowed again.
``events`` records both, in order, for the run report.
"""

from __future__ import annotations

import logging
from typing import Any

from rose_core.app.controller import controller_metrics as metrics
from rose_core.app.controller.controller_stats import ControllerStats
from rose_core.app.controller.executor_record import ExecutorRecord
from rose_core.scheduler import ElasticScheduler, SchedulerConfig

log = logging.getLogger(__name__)


class Borrowing:
    def __init__(self, scheduler: ElasticScheduler, executors: dict[str, ExecutorRecord], config: SchedulerConfig,
                 stats: ControllerStats) -> None:
        self.scheduler = scheduler
        self.executors = executors
        self.config = config
        self.stats = stats
        self.events: list[dict[str, Any]] = []
        """``borrowed`` (with every candidate's KV use) and ``revoked`` (with the turns re-routed), in order;
        ``at_s`` from when borrowing opened."""
        self.opened_at: float | None = None
        """When the job opened borrowing; None: nothing is borrowed yet."""

    def open(self, now: float) -> None:
        if self.opened_at is None:
            self.opened_at = now

    def tick(self, now: float) -> None:
        slots = self._slots()
        if slots <= 0 or self.opened_at is None:
            return
        settle = self.config.borrow_after_s
        watched = [(eid, rec) for eid, rec in self.executors.items()
                   if rec.role == "serving" and not rec.revoked and rec.heartbeats > 0
                   and now - max(self.opened_at, rec.registered_at) >= settle]
        candidates = [(eid, rec.load.serving_kv_usage_ratio) for eid, rec in watched]
        for eid in self.scheduler.borrow(candidates, limit=slots):
            ranked = ", ".join(f"{e} {u:.2e}" for e, u in sorted(candidates, key=lambda c: c[1]))
            log.info("borrowed serving executor %s (KV use, lowest first: %s)", eid, ranked)
            self.events.append({"event": "borrowed", "executor_id": eid, "at_s": round(now - self.opened_at, 3),
                                "kv_usage_ratio": dict(candidates)})

    def revoked(self, rec: ExecutorRecord, now: float) -> None:
        """Its serving owner took the executor back: re-route its turns (cancelled there), borrow no more."""
        if rec.revoked:
            return
        rec.revoked = True
        moved = self.scheduler.revoke(now, rec.executor_id)
        self.stats.reroutes += len(moved)
        metrics.TURNS_REROUTED.labels("revoked").inc(len(moved))
        log.warning("executor %s was revoked by its serving owner; %d turns re-routed", rec.executor_id, len(moved))
        opened = self.opened_at if self.opened_at is not None else now
        self.events.append({"event": "revoked", "executor_id": rec.executor_id, "at_s": round(now - opened, 3),
                            "turns_rerouted": len(moved)})

    def _slots(self) -> int:
        borrowed = sum(1 for w in self.scheduler.workers.values() if w.pool == "serving" and w.borrowed)
        return max(0, self.config.max_borrowed_workers - borrowed)
