"""The ROSE controller: executor registry, turn dispatch through the elastic scheduler, status stream.

It is driven by its owner's thread: ``pump(timeout)`` handles whatever messages arrived, then runs one
control tick (stall detection, routing, status publishing) with the wall clock. All decisions are taken by
the pure scheduler; this class only turns them into messages and messages into observations.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Never

import msgspec
import numpy as np

from rose_core.channel import ControlServer
from rose_core.config import RunConfig
from rose_core.control_endpoint import ServerEndpoint
from rose_core.controller import controller_metrics as metrics
from rose_core.controller.executor_record import ExecutorRecord
from rose_core.controller.weight_sync import ExecutorSync, SyncBreakdown
from rose_core.messages import (
    PROTOCOL_VERSION,
    STATUS_CREDIT,
    CancelTurn,
    ErrorReport,
    ExecutorStatus,
    FromController,
    Goodbye,
    Heartbeat,
    Hello,
    Register,
    SamplingParams,
    Shutdown,
    StatusAck,
    StatusSnapshot,
    StepStatus,
    ToController,
    TurnAborted,
    TurnRequest,
    TurnResult,
    WeightAnnounce,
    WeightApplied,
    Welcome,
)
from rose_core.metrics import REJECTED_MESSAGES
from rose_core.scheduler import ElasticScheduler, TurnTicket

log = logging.getLogger(__name__)
Clock = Callable[[], float]


@dataclass(slots=True)
class TurnPayload:
    prompt_token_ids: np.ndarray
    sampling: SamplingParams
    step: int


@dataclass(slots=True)
class AcceptedTurn:
    result: TurnResult
    ticket: TurnTicket
    role: str


@dataclass(slots=True)
class ControllerStats:
    late_results: int = 0
    reroutes: int = 0
    overdue: int = 0
    """Turns re-routed because they ran over ``turn_timeout_s`` on an executor that still heartbeats."""
    held_moved: int = 0
    """Turns a borrowed serving executor's guard held back, moved to dedicated executors with room
    (``scheduler.move_held_after_s``)."""
    turns_by_role: dict[str, int] = field(default_factory=lambda: {"dedicated": 0, "serving": 0})
    prompt_tokens_by_role: dict[str, int] = field(default_factory=lambda: {"dedicated": 0, "serving": 0})
    prefix_hit_tokens_by_role: dict[str, int] = field(default_factory=lambda: {"dedicated": 0, "serving": 0})
    retired: dict[str, str] = field(default_factory=dict)
    """Executors taken out of the job, and why."""

    def prefix_hit_ratio(self, role: str) -> float:
        """Accepted turns' prompt tokens served from the prefix cache, in ``role``'s pool."""
        prompt = self.prompt_tokens_by_role.get(role, 0)
        return self.prefix_hit_tokens_by_role.get(role, 0) / prompt if prompt else 0.0


class Controller:
    """``server``: the control endpoint to serve on (tests pass an ``InProcessServer``); by default a ZMQ
    ``ControlServer`` bound to ``controller.host:port`` and keyed with ``secret``."""

    def __init__(
        self,
        config: RunConfig,
        secret: bytes,
        controller_id: str = "controller",
        clock: Clock = time.monotonic,
        *,
        server: ServerEndpoint | None = None,
    ) -> None:
        self.config = config
        self.controller_id = controller_id
        self.clock = clock
        self.scheduler = ElasticScheduler(config.scheduler)
        self.executors: dict[str, ExecutorRecord] = {}
        self.stats = ControllerStats()
        self.on_result: Callable[[AcceptedTurn], None] | None = None
        self.on_tick: Callable[[float], None] | None = None
        """Called first in every tick, on the controller thread: local work such as gateway calls to submit
        (``wake`` ends the wait for messages so it runs at once)."""
        self.step_status: StepStatus | None = None
        self.history: list[StepStatus] = []
        self.weight_sync = (0.0, 0)
        self.last_sync = SyncBreakdown()
        self.borrowing: list[dict[str, Any]] = []
        """What happened to the serving executors this job: ``borrowed`` (with every candidate's KV use) and
        ``revoked`` (with the turns re-routed), in order; ``at_s`` from when borrowing opened."""
        self._borrow_from: float | None = None
        """When the job opened borrowing (``open_borrowing``); None: nothing is borrowed yet."""
        self.relays: dict[str, str] = {}
        """executor id -> the relay its cluster pulls weights through (``[[clusters]]``)."""
        self.finished = False
        self._peers: dict[bytes, str] = {}
        self._observers: dict[bytes, int] = {}
        """Each observer's snapshots sent and not yet acknowledged (``StatusAck``), at most ``STATUS_CREDIT``."""
        self._next_status = 0.0
        self.started_at = time.time()
        cc = config.controller
        self.server: ServerEndpoint = (ControlServer(f"tcp://{cc.host}:{cc.port}", secret, encrypt=cc.encrypt)
                                       if server is None else server)
        self.address = self.server.address

    # ---------------------------------------------------------------- driving

    def pump(self, timeout: float = 0.05) -> None:
        """Handle arrived messages (waiting up to ``timeout`` for the first), then one control tick."""
        item = self.server.recv(timeout)
        while item is not None:
            self._handle(*item)
            item = self.server.recv(0)
        self.tick(self.clock())

    def wake(self) -> None:
        """Any thread: run the next tick now (``on_tick`` has work), not after the wait for messages."""
        self.server.wake()

    def tick(self, now: float) -> None:
        if self.on_tick is not None:
            self.on_tick(now)
        for worker_id in self.scheduler.find_stalled(now, self.config.controller.stall_timeout_s):
            log.warning("executor %s stalled (no heartbeat for %.1fs); its turns are re-routed",
                        worker_id, self.config.controller.stall_timeout_s)
            if worker_id in self.executors:
                self.executors[worker_id].state = "stalled"
        timeout = self.config.controller.turn_timeout_s
        for worker_id, ticket in self.scheduler.find_overdue(now, timeout) if timeout > 0 else ():
            self.stats.reroutes += 1
            self.stats.overdue += 1
            metrics.TURNS_REROUTED.labels("overdue").inc()
            log.warning("turn %s ran over %.0f s on %s (it still heartbeats); re-routed and cancelled there",
                        ticket.turn_id, timeout, worker_id)
        self._move_held_turns(now)
        if self._borrow_from is not None:
            self._borrow_by_load(now)
        for cancel in self.scheduler.take_cancellations():
            rec = self.executors.get(cancel.worker_id)
            if rec is not None:  # a stalled executor that comes back must not finish a re-routed attempt
                self.server.send(rec.peer, CancelTurn(turn_id=cancel.turn_id, attempt=cancel.attempt))
        for assignment in self.scheduler.schedule(now):
            if assignment.detail:
                log.info("turn %s -> %s (%s: %s)", assignment.ticket.turn_id, assignment.worker_id,
                         assignment.reason, assignment.detail)
            self._dispatch(assignment.ticket, assignment.worker_id, assignment.reason)
        if now >= self._next_status:
            self._next_status = now + self.config.controller.status_interval_s
            self.publish_status(now)
        metrics.QUEUED_TURNS.set(len(self.scheduler.queue))
        metrics.RUNNING_TURNS.set(self.scheduler.running)

    def _move_held_turns(self, now: float) -> None:
        after = self.config.scheduler.move_held_after_s
        for worker_id, ticket in self.scheduler.find_held(now, after) if after > 0 else ():
            self.stats.reroutes += 1
            self.stats.held_moved += 1
            metrics.TURNS_REROUTED.labels("held").inc()
            log.info("turn %s held back on %s for over %.1f s while a dedicated executor has room: moved there "
                     "and cancelled on %s", ticket.turn_id, worker_id, after, worker_id)

    def open_borrowing(self) -> None:
        """The job starts: from now on serving executors are borrowed, lowest KV use first, each once its
        load has been watched for ``scheduler.borrow_after_s`` (paper: at job start, the N_serving GPUs with
        the lowest recent KV use)."""
        if self._borrow_from is None:
            self._borrow_from = self.clock()

    def _borrow_by_load(self, now: float) -> None:
        slots = self._borrow_slots()
        if slots <= 0 or self._borrow_from is None:
            return
        settle = self.config.scheduler.borrow_after_s
        watched = [(eid, rec) for eid, rec in self.executors.items()
                   if rec.role == "serving" and not rec.revoked and rec.heartbeats > 0
                   and now - max(self._borrow_from, rec.registered_at) >= settle]
        candidates = [(eid, rec.load.serving_kv_usage_ratio) for eid, rec in watched]
        for eid in self.scheduler.borrow(candidates, limit=slots):
            ranked = ", ".join(f"{e} {u:.2e}" for e, u in sorted(candidates, key=lambda c: c[1]))
            log.info("borrowed serving executor %s (KV use, lowest first: %s)", eid, ranked)
            self.borrowing.append({"event": "borrowed", "executor_id": eid, "at_s": round(now - self._borrow_from, 3),
                                   "kv_usage_ratio": dict(candidates)})

    def submit_turn(self, ticket: TurnTicket) -> None:
        self.scheduler.submit(self.clock(), ticket)

    def wait_for_executors(self, count: int, timeout: float, alive: Callable[[], None] | None = None) -> None:
        """Pump until ``count`` executors registered; ``alive`` may raise if a child process died."""
        deadline = self.clock() + timeout
        while len(self.executors) < count:
            if self.clock() > deadline:
                raise TimeoutError(f"only {len(self.executors)} of {count} executors registered in {timeout:.0f}s")
            if alive is not None:
                alive()
            self.pump(0.1)

    def retire(self, executor_id: str, reason: str) -> int:
        """Take an executor out of the job (its apply failed, its process exited): its turns are re-routed, it
        is told to stop, and nothing more is sent to it. Returns how many turns moved. It may join again
        (Hello, Register) and gets the next version like any new executor."""
        rec = self.executors.pop(executor_id, None)
        if rec is None:
            return 0
        moved = self.scheduler.remove_worker(self.clock(), executor_id, "retired")
        self.stats.reroutes += len(moved)
        self.stats.retired[executor_id] = reason
        metrics.TURNS_REROUTED.labels("retired").inc(len(moved))
        self.server.send(rec.peer, Shutdown(reason=f"taken out of the job: {reason}"))
        self._peers.pop(rec.peer, None)
        log.warning("executor %s taken out of the job (%s); %d turns re-routed; %d executors go on",
                    executor_id, reason, len(moved), len(self.executors))
        self._update_executor_gauge()
        return len(moved)

    def announce_weights(
        self, announce: WeightAnnounce, timeout: float, *, publish_s: float = 0.0, export_s: float = 0.0,
        alive: Callable[[], None] | None = None,
    ) -> dict[str, WeightApplied]:
        """Send a new version to every executor and wait until each applied it (or failed, stalled or left).

        ``publish_s`` (of which ``export_s`` is the trainer's export): what the caller spent making the version
        fetchable before this call; the sync's whole and its breakdown (``last_sync``) count it. ``alive`` is
        called while waiting (the job's watchdog: it may retire an executor whose process exited). A stalled
        executor is not waited for: it holds the old version, gets no turn outside its window, and takes the
        next version when it is back."""
        started = self.clock()
        targets = {eid: rec.peer for eid, rec in self.executors.items() if rec.state != "gone"}
        sent_at: dict[str, float] = {}
        for eid, peer in targets.items():
            sent_at[eid] = self.clock()
            relay = self.relays.get(eid, "")
            self.server.send(peer, msgspec.structs.replace(announce, relay=relay) if relay else announce)
        while True:
            done = {eid: rec.applied[announce.version] for eid, rec in self.executors.items()
                    if announce.version in rec.applied}
            pending = [eid for eid in targets
                       if eid in self.executors and eid not in done and self.executors[eid].state != "stalled"]
            if not pending:
                break
            if self.clock() - started > timeout:
                raise TimeoutError(f"executors {pending} did not apply weight version {announce.version} in {timeout:.0f}s")
            if alive is not None:
                alive()
            self.pump(0.05)
        announce_s = self.clock() - started
        parts = {eid: ExecutorSync.of(a, self.executors[eid].applied_at[announce.version] - sent_at[eid],
                                      announce.manifest_digest)
                 for eid, a in done.items() if eid in sent_at}
        self.last_sync = SyncBreakdown.of(parts, publish_s=publish_s, export_s=export_s, announce_s=announce_s)
        seconds = self.last_sync.seconds
        total = sum(a.bytes_received for a in done.values())
        self.weight_sync = (seconds, total)
        metrics.WEIGHT_VERSION.set(announce.version)
        metrics.WEIGHT_SYNC_SECONDS.observe(seconds)
        metrics.WEIGHT_SYNC_BYTES.inc(total)
        return done

    def broadcast(self, msg: FromController) -> None:
        for rec in self.executors.values():
            self.server.send(rec.peer, msg)

    def shutdown_executors(self, reason: str, timeout: float = 30.0) -> None:
        self.broadcast(Shutdown(reason=reason))
        deadline = self.clock() + timeout
        while self.executors and self.clock() < deadline:
            self.pump(0.1)

    def close(self) -> None:
        self.server.close()

    # ---------------------------------------------------------------- status

    def snapshot(self, now: float) -> StatusSnapshot:
        return StatusSnapshot(
            controller_id=self.controller_id,
            time=time.time(),
            executors=[self._status_of(rec, now) for rec in self.executors.values()],
            step=self.step_status,
            slo_ttft_ms=self.config.slo.ttft_ms,
            slo_tpot_ms=self.config.slo.tpot_ms,
            weight_sync_seconds=self.weight_sync[0],
            weight_sync_bytes=self.weight_sync[1],
            history=self.history[-50:],
            finished=self.finished,
            started_at=self.started_at,
            weight_sync_publish_seconds=self.last_sync.publish_s,
            weight_sync_transfer_seconds=self.last_sync.transfer_s,
            weight_sync_apply_seconds=self.last_sync.apply_s,
            weight_sync_wait_seconds=self.last_sync.wait_s,
        )

    def snapshot_of(self, executor_id: str) -> ExecutorStatus:
        """One executor's status now (as the status stream carries it)."""
        return self._status_of(self.executors[executor_id], self.clock())

    def _status_of(self, rec: ExecutorRecord, now: float) -> ExecutorStatus:
        worker = self.scheduler.workers.get(rec.executor_id)
        if worker is None:
            return rec.status(now)
        return rec.status(now, borrowed=worker.pool == "serving" and worker.borrowed, routed=dict(worker.routed))

    def publish_status(self, now: float) -> None:
        if not self._observers:
            return
        snap = self.snapshot(now)
        for peer, unacked in list(self._observers.items()):
            if unacked >= STATUS_CREDIT:  # behind (or stopped): it gets the newest snapshot once it acks
                metrics.STATUS_SKIPPED.inc()
                continue
            self._observers[peer] = unacked + 1
            self.server.send(peer, snap)

    # ---------------------------------------------------------------- message handling

    def _handle(self, peer: bytes, msg: ToController) -> None:
        if isinstance(msg, Hello):
            self._on_hello(peer, msg)
            return
        if isinstance(msg, ErrorReport):
            log.warning("peer %r reports %s: %s", peer, msg.code, msg.message)
            return
        if peer not in self._peers:
            REJECTED_MESSAGES.labels("no_handshake").inc()
            log.warning("rejected %s from %r: no handshake", type(msg).__name__, peer)
            self.server.send(peer, ErrorReport(code="no_handshake", message="send Hello before anything else"))
            return
        if not self._may_send(peer, msg):
            return
        match msg:  # mypy checks that every member of ToController has a case (a new one fails at `unhandled`)
            case Register():
                self._on_register(peer, msg)
            case Heartbeat():
                self._on_heartbeat(peer, msg)
            case TurnResult():
                self._on_turn_result(peer, msg)
            case TurnAborted():
                self._on_turn_aborted(peer, msg)
            case WeightApplied():
                self._on_weight_applied(peer, msg)
            case Goodbye():
                self._on_goodbye(peer, msg)
            case StatusAck():
                self._on_status_ack(peer)
            case _:
                unhandled: Never = msg
                log.warning("ignored %s from %r: not for the controller", type(unhandled).__name__, peer)

    def _may_send(self, peer: bytes, msg: ToController) -> bool:
        """Role and ownership: an observer (the dashboard) may only say Goodbye; an executor speaks only for the
        executor id it registered on this connection. Anything else is rejected and counted."""
        if isinstance(msg, Goodbye):
            rec = self.executors.get(msg.peer_id)
            return self._allowed(rec is None or rec.peer == peer, "not_owner", peer, msg)
        if isinstance(msg, StatusAck):
            return self._allowed(peer in self._observers, "wrong_role", peer, msg)
        if self._peers.get(peer) != "executor":
            return self._allowed(False, "wrong_role", peer, msg)
        rec = self.executors.get(getattr(msg, "executor_id", ""))
        return self._allowed(rec is None or rec.peer == peer, "not_owner", peer, msg)

    @staticmethod
    def _allowed(ok: bool, reason: str, peer: bytes, msg: ToController) -> bool:
        if not ok:
            REJECTED_MESSAGES.labels(reason).inc()
            log.warning("rejected %s from %r (%s)", type(msg).__name__, peer[:32], reason)
        return ok

    def _on_hello(self, peer: bytes, msg: Hello) -> None:
        if msg.protocol_version != PROTOCOL_VERSION:
            REJECTED_MESSAGES.labels("wrong_version").inc()
            self.server.send(peer, ErrorReport(
                code="wrong_version",
                message=f"peer speaks protocol {msg.protocol_version}, controller {PROTOCOL_VERSION}: upgrade to match"))
            return
        self._peers[peer] = msg.kind
        if msg.kind == "observer":
            self._observers[peer] = 0  # a Hello again (a restarted dashboard with the same id): credit renewed
        cc = self.config.controller
        self.server.send(peer, Welcome(controller_id=self.controller_id, heartbeat_interval_s=cc.heartbeat_interval_s,
                                       stall_timeout_s=cc.stall_timeout_s))
        if msg.kind == "observer":
            self.publish_status(self.clock())

    def _on_register(self, peer: bytes, msg: Register) -> None:
        now = self.clock()
        rec = ExecutorRecord(peer=peer, info=msg, registered_at=now, last_seen=now, weight_version=msg.weight_version)
        self.executors[msg.executor_id] = rec
        self.scheduler.add_worker(now, msg.executor_id, msg.role, msg.rollout_capacity, msg.weight_version)
        log.info("executor %s registered (%s, %s)", msg.executor_id, msg.role, msg.device)
        self._update_executor_gauge()

    def _borrow_slots(self) -> int:
        borrowed = sum(1 for w in self.scheduler.workers.values() if w.pool == "serving" and w.borrowed)
        return max(0, self.config.scheduler.max_borrowed_workers - borrowed)

    def _on_heartbeat(self, peer: bytes, msg: Heartbeat) -> None:
        rec = self.executors.get(msg.executor_id)
        if rec is None:
            self.server.send(peer, ErrorReport(code="not_registered", message="register before sending heartbeats"))
            return
        now = self.clock()
        rec.last_seen, rec.load, rec.state = now, msg.load, msg.load.state
        rec.weight_version = msg.load.weight_version
        rec.heartbeats += 1
        load = msg.load
        log.debug("heartbeat %s: version %d, headroom %s, budget frozen %s, held %d, in flight %d, KV %.2e",
                  msg.executor_id, load.weight_version, load.slo_headroom, load.rollout_budget_frozen,
                  load.rollout_held, load.rollout_in_flight, load.serving_kv_usage_ratio)
        self.scheduler.observe(now, msg.executor_id, weight_version=load.weight_version,
                               slo_headroom=load.slo_headroom, budget_frozen=load.rollout_budget_frozen,
                               kv_usage_ratio=load.serving_kv_usage_ratio, held=load.rollout_held,
                               warm_trajectories=load.warm_trajectories)
        if load.revoked and not rec.revoked:
            self._on_revoked(rec, now)

    def _on_revoked(self, rec: ExecutorRecord, now: float) -> None:
        """Its serving owner took the executor back: re-route its turns (cancelled there), borrow no more."""
        rec.revoked = True
        moved = self.scheduler.revoke(now, rec.executor_id)
        self.stats.reroutes += len(moved)
        metrics.TURNS_REROUTED.labels("revoked").inc(len(moved))
        log.warning("executor %s was revoked by its serving owner; %d turns re-routed", rec.executor_id, len(moved))
        opened = self._borrow_from if self._borrow_from is not None else now
        self.borrowing.append({"event": "revoked", "executor_id": rec.executor_id, "at_s": round(now - opened, 3),
                               "turns_rerouted": len(moved)})

    def _on_turn_result(self, peer: bytes, msg: TurnResult) -> None:
        now = self.clock()
        ticket = self._ticket_of(msg.turn_id)
        verdict = self.scheduler.complete(now, msg.executor_id, msg.turn_id, msg.attempt)
        if verdict != "accepted" or ticket is None:
            self.stats.late_results += 1
            metrics.LATE_RESULTS.inc()
            log.info("discarded a %s result of turn %s attempt %d", verdict, msg.turn_id, msg.attempt)
            return
        rec = self.executors.get(msg.executor_id)
        role = rec.role if rec else "dedicated"
        if rec:
            rec.turns_done += 1
        self.stats.turns_by_role[role] = self.stats.turns_by_role.get(role, 0) + 1
        prompt = len(ticket.payload.prompt_token_ids) if isinstance(ticket.payload, TurnPayload) else 0
        self.stats.prompt_tokens_by_role[role] = self.stats.prompt_tokens_by_role.get(role, 0) + prompt
        self.stats.prefix_hit_tokens_by_role[role] = (
            self.stats.prefix_hit_tokens_by_role.get(role, 0) + min(msg.prefix_hit_tokens, prompt))
        metrics.TURNS_COMPLETED.labels(role).inc()
        if self.on_result is not None:
            self.on_result(AcceptedTurn(msg, ticket, role))

    def _on_turn_aborted(self, peer: bytes, msg: TurnAborted) -> None:
        if self.scheduler.abort(self.clock(), msg.executor_id, msg.turn_id, msg.attempt, msg.reason):
            self.stats.reroutes += 1
            metrics.TURNS_REROUTED.labels(msg.reason.split(":")[0]).inc()
            log.info("turn %s aborted on %s (%s); re-routed", msg.turn_id, msg.executor_id, msg.reason)

    def _on_weight_applied(self, peer: bytes, msg: WeightApplied) -> None:
        rec = self.executors.get(msg.executor_id)
        if rec is None:
            return
        rec.applied[msg.version] = msg
        rec.applied_at[msg.version] = self.clock()
        if msg.ok:
            rec.weight_version = msg.version
            self.scheduler.observe(self.clock(), msg.executor_id, weight_version=msg.version,
                                   slo_headroom=rec.load.slo_headroom, budget_frozen=rec.load.rollout_budget_frozen,
                                   kv_usage_ratio=rec.load.serving_kv_usage_ratio, held=rec.load.rollout_held)
        else:
            log.error("executor %s failed to apply version %d: %s", msg.executor_id, msg.version, msg.error)

    def _on_status_ack(self, peer: bytes) -> None:
        self._observers[peer] = max(0, self._observers[peer] - 1)

    def _on_goodbye(self, peer: bytes, msg: Goodbye) -> None:
        self._peers.pop(peer, None)
        self._observers.pop(peer, None)
        rec = self.executors.pop(msg.peer_id, None)
        if rec is not None:
            moved = self.scheduler.remove_worker(self.clock(), msg.peer_id, "gone")
            self.stats.reroutes += len(moved)
            log.info("executor %s left (%s); %d turns re-routed", msg.peer_id, msg.reason, len(moved))
            self._update_executor_gauge()

    # ---------------------------------------------------------------- helpers

    def _dispatch(self, ticket: TurnTicket, worker_id: str, reason: str) -> None:
        payload: TurnPayload = ticket.payload
        rec = self.executors[worker_id]
        self.server.send(rec.peer, TurnRequest(
            turn_id=ticket.turn_id, trajectory_id=ticket.trajectory_id, attempt=ticket.attempt,
            prompt_token_ids=payload.prompt_token_ids, sampling=payload.sampling,
            min_version=ticket.min_version, max_version=ticket.max_version, step=payload.step))
        metrics.TURNS_ROUTED.labels(reason).inc()
        log.debug("turn %s (attempt %d) -> %s (%s)", ticket.turn_id, ticket.attempt, worker_id, reason)

    def _ticket_of(self, turn_id: str) -> TurnTicket | None:
        return self.scheduler.running_ticket(turn_id)

    def _update_executor_gauge(self) -> None:
        metrics.EXECUTORS.clear()
        for rec in self.executors.values():
            metrics.EXECUTORS.labels(rec.role, rec.state).inc()

