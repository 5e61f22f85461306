"""``CatchUp``: an executor that registers after the job's first weight version is sent the job's newest version
at once, not at the next step's announce.

Who registers late: a serving host starting a new lease (the job welcomed it back after a failed apply, its
rollout engine died or hung, or it attached mid-run), a dedicated executor started late. Each holds the version
it loaded (0) or none (-1). Until it holds a version inside the job's window the scheduler gives it no turns;
a job whose only executors are such newcomers would otherwise wait for an announce that needs their turns
first.

Invariant: an executor is sent the newest version announced to the job, once per registration; a catch-up that
fails (``failed`` names why) takes the executor out of the job, as a failed apply in a round does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rose_core.app.controller.executor_record import ExecutorRecord
from rose_core.protocol.messages import WeightAnnounce, WeightApplied

log = logging.getLogger(__name__)


class CatchUp:
    def __init__(self, send: Callable[[ExecutorRecord, WeightAnnounce], None]) -> None:
        self.send = send
        """How the controller sends an announce to one executor (through its cluster's relay)."""
        self.newest: WeightAnnounce | None = None
        self.pending: dict[str, int] = {}
        """executor id -> the version its catch-up sent, until its ``WeightApplied`` for it."""

    def announced(self, announce: WeightAnnounce) -> None:
        self.newest = announce

    def registered(self, rec: ExecutorRecord) -> None:
        """Send the newest version to an executor that does not hold it."""
        newest = self.newest
        if newest is None or rec.weight_version == newest.version:
            return
        self.pending[rec.executor_id] = newest.version
        self.send(rec, newest)
        log.info("executor %s registered at version %d: sent it version %d", rec.executor_id, rec.weight_version,
                 newest.version)

    def failed(self, msg: WeightApplied) -> str:
        """Why to take the executor out ("" when ``msg`` is not a failed catch-up)."""
        if self.pending.get(msg.executor_id) != msg.version:
            return ""
        del self.pending[msg.executor_id]
        return "" if msg.ok else f"weight version {msg.version} failed: {msg.error}"
