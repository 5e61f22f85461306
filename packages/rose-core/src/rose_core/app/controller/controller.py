"""The ROSE controller: the rooms of the control plane put together, driven by the one loop.

``pump(timeout)`` (called by ``ControlLoop`` alone) handles whatever messages arrived, then runs one control
tick with the wall clock. The rooms:

- ``ExecutorRegistry`` (``registry``): the handshake, executors' registrations, heartbeats and goodbyes, the
  role and ownership checks;
- ``TurnDispatch`` (``dispatch``): turns to the elastic scheduler and from it to executors, results back;
- ``Borrowing`` (``borrowing``): which serving executors the job borrows, revocations;
- ``StatusStream`` (``status_stream``): snapshots to dashboards;
- ``WeightRound`` (``weight_round``): a version on its way to every executor.

The attached job (``JobHooks``) gets accepted results, turns given up, and a hook at the start of every tick; what the job
waits for is a ``Future`` the controller resolves on its loop (``announce_weights``, ``registered``,
``all_gone``). All decisions are the pure scheduler's; this class turns them into messages and messages into
observations.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Never

import msgspec

from rose_core.app.config import RunConfig
from rose_core.app.controller import controller_metrics as metrics
from rose_core.app.controller.borrowing import Borrowing
from rose_core.app.controller.catch_up import CatchUp
from rose_core.app.controller.controller_stats import ControllerStats
from rose_core.app.controller.dispatch import TurnDispatch
from rose_core.app.controller.executor_record import ExecutorRecord
from rose_core.app.controller.job_hooks import JobHooks, NoJob
from rose_core.app.controller.registry import ExecutorRegistry
from rose_core.app.controller.status_stream import StatusStream
from rose_core.app.controller.weight_round import WeightRound
from rose_core.app.controller.weight_sync import SyncBreakdown
from rose_core.protocol.messages import (
    ErrorReport,
    ExecutorStatus,
    FromController,
    Goodbye,
    Heartbeat,
    Hello,
    Register,
    Shutdown,
    StatusAck,
    StatusSnapshot,
    ToController,
    TurnAborted,
    TurnResult,
    WeightAnnounce,
    WeightApplied,
)
from rose_core.scheduler import ElasticScheduler, TurnTicket
from rose_core.transport.channel import ControlServer
from rose_core.transport.control_endpoint import ServerEndpoint

log = logging.getLogger(__name__)
Clock = Callable[[], float]


class Controller:
    """``server``: the control endpoint to serve on (tests pass an ``InProcessServer``); by default a ZMQ
    ``ControlServer`` bound to ``controller.host:port`` and keyed with ``secret``. ``policy_model_dir``: the job's
    policy, named in every ``Welcome`` (a standing serving host loads it for this job)."""

    def __init__(self, config: RunConfig, secret: bytes, controller_id: str = "controller",
                 clock: Clock = time.monotonic, *, server: ServerEndpoint | None = None,
                 policy_model_dir: str = "") -> None:
        cc = config.controller
        self.config = config
        self.controller_id = controller_id
        self.clock = clock
        self.server: ServerEndpoint = (ControlServer(f"tcp://{cc.host}:{cc.port}", secret, encrypt=cc.encrypt)
                                       if server is None else server)
        self.address = self.server.address
        self.scheduler = ElasticScheduler(config.scheduler)
        self.stats = ControllerStats()
        self.registry = ExecutorRegistry(self.server, self.scheduler, self.stats, cc, controller_id, policy_model_dir)
        self.executors = self.registry.executors
        self.dispatch = TurnDispatch(self.scheduler, self.registry, self.server, config, self.stats)
        self.borrowing = Borrowing(self.scheduler, self.executors, config.scheduler, self.stats)
        self.status = StatusStream(self.server, cc.status_interval_s)
        self.job: JobHooks = NoJob()
        self.relays: dict[str, str] = {}
        """executor id -> the relay its cluster pulls weights through (``[[clusters]]``)."""
        self.catch_up = CatchUp(self._send_announce)
        self.last_sync = SyncBreakdown()
        self.weight_sync = (0.0, 0)
        self.finished = False
        self.started_at = time.time()
        self._rounds: list[WeightRound] = []
        self._waits: list[tuple[Callable[[], bool], Future[None]]] = []

    # ---------------------------------------------------------------- driving (the loop's)

    def pump(self, timeout: float = 0.05) -> None:
        """Handle arrived messages (waiting up to ``timeout`` for the first), then one control tick."""
        item = self.server.recv(timeout)
        while item is not None:
            self.handle(*item)
            item = self.server.recv(0)
        self.tick(self.clock())

    def wake(self) -> None:
        """Any thread: end the loop's wait for messages now (a job's hook has work)."""
        self.server.wake()

    def attach(self, job: JobHooks) -> None:
        """The job whose hooks the loop runs from now on."""
        self.job = job

    def tick(self, now: float) -> None:
        for given_up in self.dispatch.take_given_up():
            self.job.on_given_up(given_up)
        self.job.on_tick(now)
        self.dispatch.tick(now)
        self.borrowing.tick(now)
        self.dispatch.route(now)
        self._settle(now)
        if self.status.due(now):
            self.publish_status(now)

    # ---------------------------------------------------------------- what jobs ask

    def submit_turn(self, ticket: TurnTicket) -> None:
        self.dispatch.submit(self.clock(), ticket)

    def withdraw_turn(self, turn_id: str) -> bool:
        """The controller thread (a job's hook): the job stopped waiting for a turn. It leaves the queue, or is
        cancelled on its executor (sent by this tick's routing); a result that still comes is discarded. False
        when it was done or unknown."""
        return self.scheduler.withdraw(turn_id)

    def finish_trajectory(self, trajectory_id: str) -> None:
        """The trajectory ended: forget where its turns ran (its prefix is no reason to route anywhere)."""
        self.scheduler.finish_trajectory(trajectory_id)

    def turns_in_flight(self) -> tuple[int, int]:
        """Turns running on executors, and turns queued for one."""
        return self.scheduler.running, len(self.scheduler.queue)

    def open_borrowing(self) -> None:
        """The job starts: from now on serving executors are borrowed (``borrowing``)."""
        self.borrowing.open(self.clock())

    def broadcast(self, msg: FromController) -> None:
        for rec in self.executors.values():
            self.server.send(rec.peer, msg)

    def registered(self, count: int) -> Future[None]:
        """Done once ``count`` executors are registered."""
        return self._when(lambda: len(self.executors) >= count)

    def all_gone(self) -> Future[None]:
        """Done once no executor is registered (each said Goodbye or was retired)."""
        return self._when(lambda: not self.executors)

    def announce_weights(self, announce: WeightAnnounce, *, publish_s: float = 0.0,
                         export_s: float = 0.0) -> WeightRound:
        """Send a new version to every executor; the round's future resolves once each applied it (or failed,
        stalled or left). ``publish_s`` (of which ``export_s`` is the trainer's export): what the caller spent
        making the version fetchable; the sync's whole and its breakdown (``last_sync``) count it."""
        started = self.clock()
        sent_at: dict[str, float] = {}
        for eid, rec in list(self.executors.items()):
            if rec.state == "gone":
                continue
            sent_at[eid] = self.clock()
            self._send_announce(rec, announce)
        self.catch_up.announced(announce)
        weight_round = WeightRound(announce, sent_at, started, self.executors, publish_s=publish_s, export_s=export_s)
        self._rounds.append(weight_round)
        return weight_round

    def _send_announce(self, rec: ExecutorRecord, announce: WeightAnnounce) -> None:
        relay = self.relays.get(rec.executor_id, "")
        self.server.send(rec.peer, msgspec.structs.replace(announce, relay=relay) if relay else announce)

    def retire(self, executor_id: str, reason: str) -> int:
        """Take an executor out of the job (its apply failed, its process exited): its turns are re-routed, it
        is released (``Release``: a serving host ends the lease and serves on, a dedicated executor stops), and
        nothing more is sent to it. Returns how many turns moved. It is welcomed back (Hello,
        Register: a new lease, the next version whole) the first ``registry.WELCOMES_AFTER_RETIRE`` times."""
        moved = self.registry.retire(executor_id, reason, self.clock())
        self._settle(self.clock())
        return moved

    def shutdown_executors(self, reason: str) -> Future[None]:
        """Tell every executor to stop (what the operator of the executors does: `rose run`, which started them);
        done once all said Goodbye."""
        self.broadcast(Shutdown(reason=reason))
        return self.all_gone()

    def release_executors(self, reason: str) -> Future[None]:
        """The job is done with every executor (a fleet's: serving hosts go on serving, and lend to the next
        job); done once all said Goodbye."""
        for rec in self.executors.values():
            self.registry.release(rec, reason)
        return self.all_gone()

    def close(self) -> None:
        self.server.close()

    def serving_slo(self) -> tuple[float, float]:
        """The serving SLO the dashboard shows: the first serving host's own, once it reported one (measured
        with ``[slo] from_alone``, or its operator's), else the job's ``[slo]``."""
        known = sorted((r for r in self.executors.values() if r.role == "serving" and r.load.slo_ttft_ms > 0),
                       key=lambda r: r.executor_id)
        if known:
            return known[0].load.slo_ttft_ms, known[0].load.slo_tpot_ms
        return self.config.slo.ttft_ms, self.config.slo.tpot_ms

    # ---------------------------------------------------------------- status

    def snapshot(self, now: float) -> StatusSnapshot:
        job = self.job.status()
        slo_ttft_ms, slo_tpot_ms = self.serving_slo()
        return StatusSnapshot(
            controller_id=self.controller_id, time=time.time(),
            executors=[self._status_of(rec, now) for rec in self.executors.values()],
            step=job.step, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
            weight_sync_seconds=self.weight_sync[0], weight_sync_bytes=self.weight_sync[1],
            history=list(job.history[-50:]), finished=self.finished, started_at=self.started_at,
            weight_sync_publish_seconds=self.last_sync.publish_s,
            weight_sync_transfer_seconds=self.last_sync.transfer_s,
            weight_sync_apply_seconds=self.last_sync.apply_s, weight_sync_wait_seconds=self.last_sync.wait_s,
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
        if self.status.observers:
            self.status.publish(self.snapshot(now))

    # ---------------------------------------------------------------- message handling

    def handle(self, peer: bytes, msg: ToController) -> None:
        now = self.clock()
        if isinstance(msg, Hello):
            if self.registry.hello(peer, msg) and msg.kind == "observer":
                self.status.watch(peer)
                self.publish_status(now)
            return
        if isinstance(msg, ErrorReport):
            log.warning("peer %r reports %s: %s", peer[:32], msg.code[:64], msg.message[:300])
            return
        if not self.registry.may_send(peer, msg, self.status.is_observer):
            return
        match msg:  # mypy checks that every member of ToController has a case (a new one fails at `unhandled`)
            case Register():
                rec = self.registry.register(peer, msg, now)
                if rec is not None:
                    self.catch_up.registered(rec)
            case Heartbeat():
                rec = self.registry.heartbeat(peer, msg, now)
                if rec is not None and msg.load.revoked:
                    self.borrowing.revoked(rec, now)
            case TurnResult():
                accepted = self.dispatch.on_result(now, msg)
                if accepted is not None:
                    self.job.on_result(accepted)
            case TurnAborted():
                self.dispatch.on_aborted(now, msg)
            case WeightApplied():
                self._on_weight_applied(msg, now)
            case Goodbye():
                self.status.forget(peer)
                self.registry.goodbye(peer, msg, now)
            case StatusAck():
                self.status.acked(peer)
            case _:
                unhandled: Never = msg
                log.warning("ignored %s from %r: not for the controller", type(unhandled).__name__, peer)

    def _on_weight_applied(self, msg: WeightApplied, now: float) -> None:
        rec = self.executors.get(msg.executor_id)
        if rec is None:
            return
        rec.applied[msg.version] = msg
        rec.applied_at[msg.version] = now
        if why := self.catch_up.failed(msg):
            self.retire(msg.executor_id, why)
            return
        if msg.ok:
            rec.weight_version = msg.version
            self.registry.observe(rec, now)
        else:
            log.error("executor %s failed to apply version %d: %s", msg.executor_id, msg.version, msg.error)

    # ---------------------------------------------------------------- futures

    def _when(self, condition: Callable[[], bool]) -> Future[None]:
        future: Future[None] = Future()
        self._waits.append((condition, future))
        self._settle(self.clock())
        return future

    def _settle(self, now: float) -> None:
        """Resolve what the job waits for that is now true (on the loop, after the messages that made it so)."""
        for weight_round in [r for r in self._rounds if r.settle(now)]:
            self._rounds.remove(weight_round)
            self._synced(weight_round)
        for condition, future in [w for w in self._waits if w[0]()]:
            self._waits.remove((condition, future))
            future.set_result(None)

    def _synced(self, weight_round: WeightRound) -> None:
        self.last_sync = breakdown = weight_round.breakdown
        total = sum(a.bytes_received for a in weight_round.future.result().values())
        self.weight_sync = (breakdown.seconds, total)
        metrics.WEIGHT_VERSION.set(weight_round.version)
        metrics.WEIGHT_SYNC_SECONDS.observe(breakdown.seconds)
        metrics.WEIGHT_SYNC_BYTES.inc(total)
