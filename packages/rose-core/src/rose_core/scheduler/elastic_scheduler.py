"""The elastic rollout scheduler: routes every turn to a dedicated or a borrowed serving worker.

Pure policy: every method takes ``now`` and observations and returns decisions; it never reads a clock,
sleeps or does I/O. The controller drives it with the wall clock, the simulator with simulated time.

Routing order for a turn: the affine worker (where its trajectory's last turn ran) if it can take it ->
the least-loaded dedicated worker -> the least-loaded borrowed serving worker that reports SLO headroom
and an unfrozen memory budget -> the FIFO queue (re-routed turns keep their place: fair aging).
A worker can take a turn only if it holds a weight version inside the turn's allowed window.
Long tail (move back when capacity frees): a turn whose affine worker is a borrowed serving worker goes to
the least-loaded dedicated worker with room, if any (reason ``long_tail``): a trajectory spills to serving
GPUs under contention, and at the end of a step, when dedicated GPUs free up while borrowed ones (slowed by
serving) still hold stragglers, the stragglers' next turns run where they finish sooner. The reverse move
(off a busy dedicated worker onto an idle borrowed one) is not made: a borrowed GPU's speed depends on its
serving load, which the scheduler does not model.

Workers are changed only through this class (it keeps a load index of them for the least-loaded pick).

Invariants (property-tested): every submitted turn is exactly one of queued, running on one worker, or
done; a result is accepted once, only from the worker and attempt it was last assigned to; results of
re-routed attempts are discarded and counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from rose_core.config import SchedulerConfig
from rose_core.scheduler.load_index import LoadIndex
from rose_core.scheduler.turn_queue import TurnQueue
from rose_core.scheduler.turn_ticket import TurnTicket
from rose_core.scheduler.worker_state import Pool, WorkerState

Verdict = Literal["accepted", "late", "duplicate", "unknown"]
_STILL_RUNNING = frozenset({"stalled", "revoked"})
"""Evacuation reasons after which the old worker may still be running the turns (it is not gone)."""


@dataclass(slots=True, frozen=True)
class Assignment:
    ticket: TurnTicket
    worker_id: str
    reason: str
    """affinity | dedicated | borrowed | long_tail"""


@dataclass(slots=True, frozen=True)
class Cancellation:
    """A turn re-routed away from a worker that may still run it: tell ``worker_id`` to stop that attempt."""

    worker_id: str
    turn_id: str
    attempt: int


class ElasticScheduler:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.workers: dict[str, WorkerState] = {}
        self.queue = TurnQueue()
        self._running: dict[str, tuple[str, TurnTicket]] = {}
        self._done: set[str] = set()
        self._affinity: dict[str, str] = {}
        self.counters: Counter[str] = Counter()
        self._index = LoadIndex()
        self._cancellations: list[Cancellation] = []

    # ---------------------------------------------------------------- workers

    def add_worker(self, now: float, worker_id: str, pool: Pool, capacity: int, weight_version: int) -> WorkerState:
        """A worker joined (or re-registered after a restart: its old turns are re-routed)."""
        if worker_id in self.workers:
            self.remove_worker(now, worker_id, "re-registered")
        cap = min(capacity, self.config.max_concurrency_per_worker)
        state = WorkerState(worker_id, pool, cap, weight_version, last_seen=now, borrowed=pool == "dedicated")
        self.workers[worker_id] = state
        self._index.refile(state)
        return state

    def borrow(self, candidates: Iterable[tuple[str, float]], limit: int | None = None) -> list[str]:
        """Borrow up to N serving workers with the lowest recent KV usage; at most one job per worker."""
        n = self.config.max_borrowed_workers if limit is None else limit
        free = sorted((usage, wid) for wid, usage in candidates if wid in self.workers and not self.workers[wid].borrowed)
        chosen = [wid for _, wid in free[:n]]
        for wid in chosen:
            self.workers[wid].borrowed = True
            self._index.refile(self.workers[wid])
        return chosen

    def release_borrowed(self, now: float) -> list[str]:
        """End of job: give every borrowed serving worker back (their running turns are re-routed)."""
        released = [w.worker_id for w in self.workers.values() if w.pool == "serving" and w.borrowed]
        for wid in released:
            self.revoke(now, wid)
        return released

    def revoke(self, now: float, worker_id: str) -> list[TurnTicket]:
        """The serving owner takes a borrowed worker back: stop routing to it, re-route its turns."""
        worker = self.workers.get(worker_id)
        if worker is None:
            return []
        worker.borrowed = False
        self._index.refile(worker)
        return self._evacuate(now, worker, "revoked")

    def observe(
        self,
        now: float,
        worker_id: str,
        *,
        weight_version: int,
        slo_headroom: bool = True,
        budget_frozen: bool = False,
        kv_usage_ratio: float = 0.0,
    ) -> None:
        """A heartbeat's load report."""
        worker = self.workers.get(worker_id)
        if worker is None or worker.health == "gone":
            return
        worker.last_seen = now
        worker.health = "ready"
        worker.weight_version = weight_version
        worker.slo_headroom = slo_headroom
        worker.budget_frozen = budget_frozen
        worker.kv_usage_ratio = kv_usage_ratio
        self._index.refile(worker)

    def find_stalled(self, now: float, stall_timeout_s: float) -> list[str]:
        """Workers silent past the timeout are treated as failed: their turns are re-routed."""
        stalled = []
        for worker in self.workers.values():
            if worker.health == "ready" and now - worker.last_seen > stall_timeout_s:
                worker.health = "stalled"
                self._index.refile(worker)
                self._evacuate(now, worker, "stalled")
                stalled.append(worker.worker_id)
        return stalled

    def remove_worker(self, now: float, worker_id: str, reason: str = "gone") -> list[TurnTicket]:
        worker = self.workers.pop(worker_id, None)
        if worker is None:
            return []
        worker.health = "gone"
        self._index.discard(worker_id)
        return self._evacuate(now, worker, reason)

    # ---------------------------------------------------------------- turns

    def submit(self, now: float, ticket: TurnTicket) -> None:
        if ticket.turn_id in self._done or ticket.turn_id in self._running:
            raise ValueError(f"turn {ticket.turn_id} was already submitted")
        self.queue.push(ticket)
        self.counters["submitted"] += 1

    def schedule(self, now: float) -> list[Assignment]:
        """Place queued turns, oldest first, on workers that can take them."""
        out: list[Assignment] = []
        refused: set[tuple[int, int]] = set()
        """Version windows no worker can take in this call (until a placement changes the index)."""

        def place(ticket: TurnTicket) -> bool:
            window = (ticket.min_version, ticket.max_version)
            found = self._pick(ticket, skip_pools=window in refused)
            if found is None:
                refused.add(window)
                return False
            worker, reason = found
            worker.in_flight[ticket.turn_id] = ticket.attempt
            self._index.refile(worker)
            self._running[ticket.turn_id] = (worker.worker_id, ticket)
            self.counters[f"routed_{reason}"] += 1
            refused.clear()
            out.append(Assignment(ticket, worker.worker_id, reason))
            return True

        if self.queue:  # stop as soon as no worker has room: a saturated fleet costs O(1), not O(scan limit)
            self.queue.drain(place, self.config.queue_scan_limit, lambda: len(self._index) > 0)
        return out

    def complete(self, now: float, worker_id: str, turn_id: str, attempt: int) -> Verdict:
        """A result arrived. Only the current attempt on its assigned worker is accepted."""
        if turn_id in self._done:
            self.counters["duplicate_results"] += 1
            return "duplicate"
        running = self._running.get(turn_id)
        if running is None or running[0] != worker_id or running[1].attempt != attempt:
            self.counters["late_results"] += 1
            return "late" if running is not None or self._known_queued(turn_id) else "unknown"
        del self._running[turn_id]
        self._done.add(turn_id)
        worker = self.workers.get(worker_id)
        if worker is not None:
            worker.in_flight.pop(turn_id, None)
            worker.turns_done += 1
            self._index.refile(worker)
        self._affinity[running[1].trajectory_id] = worker_id
        self.counters["completed"] += 1
        return "accepted"

    def abort(self, now: float, worker_id: str, turn_id: str, attempt: int, reason: str) -> bool:
        """The worker gave the turn back: re-route it (a stale abort is ignored)."""
        running = self._running.get(turn_id)
        if running is None or running[0] != worker_id or running[1].attempt != attempt:
            self.counters["stale_aborts"] += 1
            return False
        self._requeue(turn_id, f"aborted_{reason.split(':', maxsplit=1)[0]}")
        return True

    def finish_trajectory(self, trajectory_id: str) -> None:
        """Forget a finished trajectory's affinity."""
        self._affinity.pop(trajectory_id, None)

    # ---------------------------------------------------------------- introspection

    @property
    def running(self) -> int:
        return len(self._running)

    def where(self, turn_id: str) -> str | None:
        running = self._running.get(turn_id)
        return running[0] if running else None

    def running_ticket(self, turn_id: str) -> TurnTicket | None:
        running = self._running.get(turn_id)
        return running[1] if running else None

    def is_done(self, turn_id: str) -> bool:
        return turn_id in self._done

    # ---------------------------------------------------------------- internals

    def _pick(self, ticket: TurnTicket, skip_pools: bool = False) -> tuple[WorkerState, str] | None:
        """``skip_pools``: the pools are known to hold no worker for this window; only affinity can place."""
        lo, hi = ticket.min_version, ticket.max_version
        affine = self.workers.get(self._affinity.get(ticket.trajectory_id, ""))
        if affine is not None and self._fits(affine, ticket):
            back = None if skip_pools or affine.pool != "serving" else self._index.least_loaded("dedicated", lo, hi)
            return (back, "long_tail") if back is not None else (affine, "affinity")
        if skip_pools:
            return None
        dedicated = self._index.least_loaded("dedicated", lo, hi)
        if dedicated is not None:
            return dedicated, "dedicated"
        borrowed = self._index.least_loaded("serving", lo, hi)
        return (borrowed, "borrowed") if borrowed is not None else None

    @staticmethod
    def _fits(worker: WorkerState, ticket: TurnTicket) -> bool:
        return worker.usable() and worker.holds(ticket.min_version, ticket.max_version)

    def take_cancellations(self) -> list[Cancellation]:
        """The attempts re-routed away from workers that may still run them (stalled ones), once each."""
        taken, self._cancellations = self._cancellations, []
        return taken

    def _evacuate(self, now: float, worker: WorkerState, reason: str) -> list[TurnTicket]:
        moved = [self._requeue(turn_id, f"rerouted_{reason}") for turn_id in list(worker.in_flight)]
        if reason in _STILL_RUNNING:  # the worker may still run them: the controller cancels them there
            self._cancellations += [Cancellation(worker.worker_id, t.turn_id, t.attempt - 1) for t in moved]
        for trajectory, wid in list(self._affinity.items()):
            if wid == worker.worker_id:
                del self._affinity[trajectory]
        return moved

    def _requeue(self, turn_id: str, counter: str) -> TurnTicket:
        worker_id, ticket = self._running.pop(turn_id)
        worker = self.workers.get(worker_id)
        if worker is not None:
            worker.in_flight.pop(turn_id, None)
            self._index.refile(worker)
        ticket.attempt += 1
        self.queue.push(ticket)
        self.counters[counter] += 1
        return ticket

    def _known_queued(self, turn_id: str) -> bool:
        return any(t.turn_id == turn_id for t in self.queue)
