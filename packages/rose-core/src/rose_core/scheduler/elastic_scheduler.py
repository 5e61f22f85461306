"""The elastic rollout scheduler: routes every turn to a dedicated or a borrowed serving worker.

Pure policy: every method takes ``now`` and observations and returns decisions; it never reads a clock,
sleeps or does I/O. The controller drives it with the wall clock, the simulator with simulated time.

Routing order for a turn: the affine worker (where its trajectory's last turn ran, holding its prefix KV)
if it can take it -> the least-loaded dedicated worker -> the least-loaded borrowed serving worker that
reports SLO headroom and an unfrozen memory budget -> the FIFO queue (re-routed turns keep their place:
fair aging). A worker can take a turn only if it holds a weight version inside the turn's allowed window.
A worker that has no room, or whose serving needs it back (no SLO headroom, frozen budget, revoked), is
not affine: the turn is routed as a new one.

Long tail (reason ``long_tail``, with its cause in ``Assignment.detail``): affinity to a borrowed serving
worker is overridden for the least-loaded dedicated worker with room when (a) the trajectory's prefix is not
warm there any more (its heartbeat's ``warm_trajectories`` dropped it: moving costs no cache), or (b) that
worker is holding turns back for serving (its last heartbeat): serving is busy there, so the next turn runs
where it finishes sooner, prefix or not. Otherwise the warm prefix wins. The reverse move (off
a busy dedicated worker onto an idle borrowed one) is not made: a borrowed GPU's speed depends on its
serving load, which the scheduler does not model.

Held turns (``find_held``): turns that a borrowed serving worker's guard holds back, waiting to start or
running in the engine it paused (its heartbeats have said so for ``move_held_after_s``), move to dedicated
workers with room, newest first (the guard releases in order, so the newest are the ones not started, or
the paused ones that generated least), as many as it holds and the dedicated pool can take: each is
re-routed, avoids that worker for ``AVOID_S`` and is cancelled there. Queued turns take the dedicated room
first (none moves while as many wait). A serving burst then costs a step nothing while the dedicated pool has
room, instead of holding its turns for the guard's latency window.

Turn timeout (``find_overdue``): a turn assigned longer than the bound to a worker that still heartbeats
(held by its guard, or stuck) is re-routed and cancelled there, like the turns of a stalled worker.

Failed turns: a turn given back as failed on its worker (``engine_error``, or ``invalid_result``: a result the
controller refused) is never offered to that worker again and is tried at most ``turn_retries`` more times;
then, or once it has failed on every worker there is, it is given up (``take_given_up``) and the job drops its
trajectory. A turn that kills engines cannot walk from one lent host to the next.

Workers are changed only through this class (it keeps a load index of them for the least-loaded pick).

Invariants (property-tested): every submitted turn is exactly one of queued, running on one worker, or
done (a given-up turn is done); a result is accepted once, only from the worker and attempt it was last
assigned to; results of re-routed attempts are discarded and counted; a turn never runs again on a worker it
failed on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from rose_core.scheduler.decisions import Assignment, Cancellation, GivenUp, Verdict
from rose_core.scheduler.load_index import LoadIndex
from rose_core.scheduler.scheduler_config import SchedulerConfig
from rose_core.scheduler.turn_queue import TurnQueue
from rose_core.scheduler.turn_ticket import TurnTicket
from rose_core.scheduler.worker_state import Pool, WorkerState

_STILL_RUNNING = frozenset({"stalled", "revoked", "overdue"})
"""Evacuation reasons after which the old worker may still be running the turns (it is not gone)."""
_NO_ROOM = frozenset({"memory", "capacity"})
"""Abort reasons that say the worker had no room for this turn: it avoids that worker for ``AVOID_S``."""
_FAILED = frozenset({"engine_error", "invalid_result"})
"""Abort reasons that say the turn failed on that worker: counted against ``turn_retries``; never sent there again."""
AVOID_S = 2.0
"""How long a turn refused for lack of room keeps off the worker that refused it (about a heartbeat)."""


class ElasticScheduler:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.workers: dict[str, WorkerState] = {}
        self.queue = TurnQueue()
        self._running: dict[str, tuple[str, TurnTicket]] = {}
        self._assigned_at: dict[str, float] = {}
        self._done: set[str] = set()
        self._affinity: dict[str, str] = {}
        self.counters: Counter[str] = Counter()
        self._index = LoadIndex()
        self._cancellations: list[Cancellation] = []
        self._given_up: list[GivenUp] = []

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
        free = sorted((usage, wid) for wid, usage in candidates
                      if wid in self.workers and not self.workers[wid].borrowed and not self.workers[wid].revoked)
        chosen = [wid for _, wid in free[:n]]
        for wid in chosen:
            self.workers[wid].borrowed = True
            self._index.refile(self.workers[wid])
        return chosen

    def revoke(self, now: float, worker_id: str) -> list[TurnTicket]:
        """The serving owner takes a borrowed worker back: stop routing to it (for the rest of the job),
        re-route its turns and cancel them there."""
        worker = self.workers.get(worker_id)
        if worker is None:
            return []
        worker.borrowed = False
        worker.revoked = True
        self._index.refile(worker)
        return self._evacuate(now, worker, "revoked")

    def lend_again(self, worker_id: str) -> None:
        """The serving owner lends a revoked worker again: it may be borrowed (``borrow``) once more."""
        worker = self.workers.get(worker_id)
        if worker is not None:
            worker.revoked = False

    def observe(
        self,
        now: float,
        worker_id: str,
        *,
        weight_version: int,
        slo_headroom: bool = True,
        budget_frozen: bool = False,
        kv_usage_ratio: float = 0.0,
        held: int = 0,
        warm_trajectories: Iterable[str] | None = None,
    ) -> None:
        """A heartbeat's load report (``warm_trajectories`` None: what the scheduler knows stays)."""
        worker = self.workers.get(worker_id)
        if worker is None or worker.health == "gone":
            return
        worker.last_seen = now
        worker.health = "ready"
        worker.weight_version = weight_version
        worker.slo_headroom = slo_headroom
        worker.budget_frozen = budget_frozen
        worker.kv_usage_ratio = kv_usage_ratio
        worker.held = held
        if held == 0:
            worker.held_since = None
        elif worker.held_since is None:
            worker.held_since = now
        if warm_trajectories is not None:
            worker.warm = set(warm_trajectories)
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

    def find_overdue(self, now: float, turn_timeout_s: float) -> list[tuple[str, TurnTicket]]:
        """Turns assigned longer than ``turn_timeout_s`` to a worker that still heartbeats (held by its
        guard, or stuck): re-routed and cancelled there. Returns ``(old worker, re-queued ticket)``."""
        cutoff = now - turn_timeout_s
        overdue = [tid for tid, at in self._assigned_at.items() if at < cutoff]
        moved = []
        for turn_id in overdue:
            worker_id = self._running[turn_id][0]
            ticket = self._requeue(turn_id, "rerouted_overdue")
            self._cancellations.append(Cancellation(worker_id, turn_id, ticket.attempt - 1))
            moved.append((worker_id, ticket))
        return moved

    def find_held(self, now: float, after_s: float) -> list[tuple[str, TurnTicket]]:
        """Turns held back on borrowed serving workers (held for ``after_s``) moved to dedicated workers with
        room (see the module docstring). Returns ``(old worker, re-queued ticket)``."""
        room = {w.worker_id: w.capacity - w.load for w in self.workers.values()
                if w.pool == "dedicated" and w.usable()}
        spare = sum(room.values()) - len(self.queue)  # queued turns take the dedicated room first
        moved: list[tuple[str, TurnTicket]] = []
        for worker in self.workers.values():
            if spare - len(moved) <= 0:
                break
            if worker.pool == "serving" and worker.held_since is not None and now - worker.held_since >= after_s:
                moved += self._move_held(now, worker, room, spare - len(moved))
        return moved

    def _move_held(
        self, now: float, worker: WorkerState, room: dict[str, int], limit: int
    ) -> list[tuple[str, TurnTicket]]:
        """Up to ``limit`` of ``worker``'s newest ``worker.held`` turns, each to a dedicated worker with ``room``
        (taken from it)."""
        moved = []
        newest = sorted(worker.in_flight, key=lambda t: self._assigned_at.get(t, 0.0), reverse=True)
        for turn_id in newest[: min(worker.held, limit)]:
            ticket = self._running[turn_id][1]
            target = next((wid for wid, free in room.items()
                           if free > 0 and self.workers[wid].holds(ticket.min_version, ticket.max_version)), None)
            if target is None:
                continue
            room[target] -= 1
            self._requeue(turn_id, "rerouted_held")
            ticket.avoid, ticket.avoid_until = worker.worker_id, now + AVOID_S
            self._cancellations.append(Cancellation(worker.worker_id, turn_id, ticket.attempt - 1))
            moved.append((worker.worker_id, ticket))
        if moved:  # what it holds now comes with a later heartbeat: wait ``after_s`` again before moving more
            worker.held = max(0, worker.held - len(moved))
            worker.held_since = now if worker.held else None
        return moved

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
            excluded = ticket.failed_on + ((ticket.avoid,) if now < ticket.avoid_until else ())
            found = self._pick(ticket, excluded, skip_pools=window in refused)
            if found is None:
                if not excluded:  # a worker kept off this turn says nothing about other turns of this window
                    refused.add(window)
                return False
            ticket.avoid = ""
            worker, reason, detail = found
            worker.in_flight[ticket.turn_id] = ticket.attempt
            self._index.refile(worker)
            self._running[ticket.turn_id] = (worker.worker_id, ticket)
            self._assigned_at[ticket.turn_id] = now
            self.counters[f"routed_{reason}"] += 1
            worker.routed[reason] += 1
            refused.clear()
            out.append(Assignment(ticket, worker.worker_id, reason, detail))
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
        worker, _ = self._unassign(turn_id)
        self._done.add(turn_id)
        if worker is not None:
            worker.turns_done += 1
            worker.warm.add(running[1].trajectory_id)  # its prefix is in that worker's cache now
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
        kind, ticket = reason.split(":", maxsplit=1)[0], running[1]
        if kind in _FAILED:
            ticket.failed_on += (worker_id,)
            if len(ticket.failed_on) > self.config.turn_retries or self.workers.keys() <= set(ticket.failed_on):
                self._unassign(turn_id)
                self._done.add(turn_id)
                self._given_up.append(GivenUp(ticket, reason))
                self.counters["given_up"] += 1
                return True
        self._requeue(turn_id, f"aborted_{kind}")
        if reason in _NO_ROOM:  # do not send it straight back (its warm affinity points there)
            ticket.avoid, ticket.avoid_until = worker_id, now + AVOID_S
        return True

    def withdraw(self, turn_id: str) -> bool:
        """The job no longer wants the turn (its caller stopped waiting): taken out of the queue, or off its worker
        with a cancellation for it (``take_cancellations``); done either way, so a result that still comes is a
        duplicate. False when it is already done or unknown."""
        if turn_id in self._done:
            return False
        running = self._running.get(turn_id)
        if running is not None:
            self._unassign(turn_id)
            self._cancellations.append(Cancellation(running[0], turn_id, running[1].attempt))
        elif self.queue.remove(turn_id) is None:
            return False
        self._done.add(turn_id)
        self.counters["withdrawn"] += 1
        return True

    def take_given_up(self) -> list[GivenUp]:
        """The turns given up since the last call (their jobs drop their trajectories), once each."""
        taken, self._given_up = self._given_up, []
        return taken

    def finish_trajectory(self, trajectory_id: str) -> None:
        """Forget a finished trajectory's affinity."""
        worker = self.workers.get(self._affinity.pop(trajectory_id, ""))
        if worker is not None:
            worker.warm.discard(trajectory_id)

    # ---------------------------------------------------------------- introspection

    @property
    def running(self) -> int:
        return len(self._running)

    def where(self, turn_id: str) -> str | None:
        running = self._running.get(turn_id)
        return running[0] if running else None

    def is_done(self, turn_id: str) -> bool:
        """Its result was accepted, or it was given up."""
        return turn_id in self._done

    def running_ticket(self, turn_id: str) -> TurnTicket | None:
        running = self._running.get(turn_id)
        return running[1] if running else None

    # ---------------------------------------------------------------- internals

    def _pick(self, ticket: TurnTicket, excluded: tuple[str, ...] = (), skip_pools: bool = False
              ) -> tuple[WorkerState, str, str] | None:
        """``excluded``: workers the turn failed on, and one that just refused it for lack of room (the turn
        waits for another worker rather than go back). ``skip_pools``: the pools are known to hold no worker for
        this window; only affinity can place."""
        lo, hi = ticket.min_version, ticket.max_version
        affine = self.workers.get(self._affinity.get(ticket.trajectory_id, ""))
        if affine is not None and affine.worker_id not in excluded and self._fits(affine, ticket):
            moved = None if skip_pools or affine.pool != "serving" else self._long_tail(affine, ticket, excluded)
            return moved if moved is not None else (affine, "affinity", "")
        if skip_pools:
            return None
        dedicated = self._index.least_loaded("dedicated", lo, hi, excluded)
        if dedicated is not None:
            return dedicated, "dedicated", ""
        borrowed = self._index.least_loaded("serving", lo, hi, excluded)
        return None if borrowed is None else (borrowed, "borrowed", "")

    def _long_tail(self, affine: WorkerState, ticket: TurnTicket, excluded: tuple[str, ...]
                   ) -> tuple[WorkerState, str, str] | None:
        """Override affinity to a borrowed worker (see the module docstring), or None to keep it."""
        back = self._index.least_loaded("dedicated", ticket.min_version, ticket.max_version, excluded)
        if back is None:
            return None
        if ticket.trajectory_id not in affine.warm:
            return back, "long_tail", f"prefix cold on {affine.worker_id}"
        if affine.held > 0:
            return back, "long_tail", f"{affine.worker_id} holds {affine.held} turns for serving"
        return None

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

    def _unassign(self, turn_id: str) -> tuple[WorkerState | None, TurnTicket]:
        """Take a running turn off its worker (still registered: returned, re-filed)."""
        worker_id, ticket = self._running.pop(turn_id)
        self._assigned_at.pop(turn_id, None)
        worker = self.workers.get(worker_id)
        if worker is not None:
            worker.in_flight.pop(turn_id, None)
            self._index.refile(worker)
        return worker, ticket

    def _requeue(self, turn_id: str, counter: str) -> TurnTicket:
        _, ticket = self._unassign(turn_id)
        ticket.attempt += 1
        self.queue.push(ticket)
        self.counters[counter] += 1
        return ticket

    def _known_queued(self, turn_id: str) -> bool:
        return any(t.turn_id == turn_id for t in self.queue)
