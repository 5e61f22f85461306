"""Who is connected to the controller, and as what: the handshake (``Hello`` -> ``Welcome``), executors'
registrations, heartbeats and goodbyes, and the role and ownership every later message is checked against.

An executor's record is the controller's view of it (its load from the last heartbeat, the versions it
applied); the scheduler learns of every executor that joins, reports or leaves here. A peer that did not
say Hello, or speaks for another executor than the one it registered on its connection, or as a role it does
not have, is rejected and counted (``rose_rejected_messages_total{reason}``); so is a registration that fails
``result_check.registration_problem`` (the executor is told why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rose_core.app.config import ControllerConfig
from rose_core.app.controller import controller_metrics as metrics
from rose_core.app.controller.controller_stats import ControllerStats
from rose_core.app.controller.executor_record import ExecutorRecord
from rose_core.app.controller.result_check import registration_problem
from rose_core.protocol import messages as m
from rose_core.scheduler import ElasticScheduler
from rose_core.support.metrics import REJECTED_MESSAGES
from rose_core.transport.control_endpoint import ServerEndpoint

log = logging.getLogger(__name__)

WELCOMES_AFTER_RETIRE = 2
"""How many times a job welcomes back an executor it took out (a serving host whose weight apply failed starts
a new lease with a fresh or reset rollout engine); once more and it stays released for the job's life."""


class ExecutorRegistry:
    def __init__(self, server: ServerEndpoint, scheduler: ElasticScheduler, stats: ControllerStats,
                 config: ControllerConfig, controller_id: str, policy_model_dir: str = "") -> None:
        self.server = server
        self.scheduler = scheduler
        self.stats = stats
        self.config = config
        self.controller_id = controller_id
        self.executors: dict[str, ExecutorRecord] = {}
        self.peers: dict[bytes, str] = {}
        """Every peer that said Hello, and its kind (executor, observer)."""
        self.released: set[str] = set()
        """Executors this job released (``release``): their Hello is answered ``released``, not welcomed (a
        serving host looks for its next job; this one is done with it)."""
        self.retirements: dict[str, int] = {}
        """How often each executor was taken out of the job (a failed weight apply, a process gone)."""
        self.returning: set[str] = set()
        """Serving hosts taken out that the job welcomes back and that have not registered again yet."""
        self.policy_model_dir = policy_model_dir
        """The job's policy (``Welcome.policy_model_dir``)."""

    # ---------------------------------------------------------------- the handshake

    def hello(self, peer: bytes, msg: m.Hello) -> bool:
        """Welcome the peer (True), or tell it why not (a protocol version other than this controller's)."""
        if msg.protocol_version != m.PROTOCOL_VERSION:
            REJECTED_MESSAGES.labels("wrong_version").inc()
            self.server.send(peer, m.ErrorReport(
                code="wrong_version",
                message=f"peer speaks protocol {msg.protocol_version}, controller {m.PROTOCOL_VERSION}: upgrade to match"))
            return False
        if msg.kind == "executor" and msg.peer_id in self.released:
            self.server.send(peer, m.ErrorReport(code="released", message="this job released the executor"))
            return False
        self.peers[peer] = msg.kind
        self.server.send(peer, m.Welcome(controller_id=self.controller_id,
                                       heartbeat_interval_s=self.config.heartbeat_interval_s,
                                       stall_timeout_s=self.config.stall_timeout_s,
                                       policy_model_dir=self.policy_model_dir))
        return True

    def may_send(self, peer: bytes, msg: m.ToController, observers: Callable[[bytes], bool]) -> bool:
        """Handshake, role and ownership: an observer (a dashboard) may only acknowledge snapshots and say
        Goodbye; an executor speaks only for the executor id it registered on this connection."""
        if peer not in self.peers:
            REJECTED_MESSAGES.labels("no_handshake").inc()
            log.warning("rejected %s from %r: no handshake", type(msg).__name__, peer)
            self.server.send(peer, m.ErrorReport(code="no_handshake", message="send Hello before anything else"))
            return False
        if isinstance(msg, m.Goodbye):
            rec = self.executors.get(msg.peer_id)
            return _allowed(rec is None or rec.peer == peer, "not_owner", peer, msg)
        if isinstance(msg, m.StatusAck):
            return _allowed(observers(peer), "wrong_role", peer, msg)
        if self.peers.get(peer) != "executor":
            return _allowed(False, "wrong_role", peer, msg)
        rec = self.executors.get(getattr(msg, "executor_id", ""))
        return _allowed(rec is None or rec.peer == peer, "not_owner", peer, msg)

    # ---------------------------------------------------------------- executors

    def register(self, peer: bytes, msg: m.Register, now: float) -> ExecutorRecord | None:
        """The executor's record (None: its registration was refused, and it was told why)."""
        problem = registration_problem(msg)
        if problem:
            REJECTED_MESSAGES.labels("bad_registration").inc()
            log.warning("refused the registration of %r from %r: %s", msg.executor_id[:64], peer[:32], problem)
            self.server.send(peer, m.ErrorReport(code="bad_registration", message=problem))
            return None
        rec = ExecutorRecord(peer=peer, info=msg, registered_at=now, last_seen=now, weight_version=msg.weight_version)
        self.executors[msg.executor_id] = rec
        self.scheduler.add_worker(now, msg.executor_id, msg.role, msg.rollout_capacity, msg.weight_version)
        self.returning.discard(msg.executor_id)
        log.info("executor %s registered (%s, %s)", msg.executor_id, msg.role, msg.device)
        self.update_gauge()
        return rec

    def heartbeat(self, peer: bytes, msg: m.Heartbeat, now: float) -> ExecutorRecord | None:
        """Note an executor's load (the scheduler sees it too); None when it is not registered (told so)."""
        rec = self.executors.get(msg.executor_id)
        if rec is None:
            self.server.send(peer, m.ErrorReport(code="not_registered", message="register before sending heartbeats"))
            return None
        load = msg.load
        rec.last_seen, rec.load, rec.state = now, load, load.state
        rec.weight_version = load.weight_version
        rec.heartbeats += 1
        log.debug("heartbeat %s: version %d, headroom %s, budget frozen %s, held %d, in flight %d, KV %.2e",
                  msg.executor_id, load.weight_version, load.slo_headroom, load.rollout_budget_frozen,
                  load.rollout_held, load.rollout_in_flight, load.serving_kv_usage_ratio)
        self.observe(rec, now, warm_trajectories=load.warm_trajectories)
        return rec

    def observe(self, rec: ExecutorRecord, now: float, warm_trajectories: list[str] | None = None) -> None:
        """Tell the scheduler what the executor's record says now."""
        load = rec.load
        self.scheduler.observe(now, rec.executor_id, weight_version=rec.weight_version,
                               slo_headroom=load.slo_headroom, budget_frozen=load.rollout_budget_frozen,
                               kv_usage_ratio=load.serving_kv_usage_ratio, held=load.rollout_held,
                               warm_trajectories=warm_trajectories)

    def goodbye(self, peer: bytes, msg: m.Goodbye, now: float) -> None:
        """An executor leaves: its turns are re-routed. One its operator revoked (its heartbeats said so) is
        not welcomed again by this job: revoking takes a serving host back from the job, not for a moment."""
        self.peers.pop(peer, None)
        rec = self.executors.pop(msg.peer_id, None)
        if rec is None:
            return
        moved = self.scheduler.remove_worker(now, msg.peer_id, "gone")
        self.stats.reroutes += len(moved)
        if msg.peer_id not in self.released:
            self.stats.left[msg.peer_id] = msg.reason[:200]
        if rec.revoked:
            self.released.add(msg.peer_id)
        log.info("executor %s left (%s); %d turns re-routed", msg.peer_id, msg.reason, len(moved))
        self.update_gauge()

    def retire(self, executor_id: str, reason: str, now: float) -> int:
        """Take an executor out of the job: its turns are re-routed, it is released (a serving host goes on
        serving production and ends the lease, its rollout engine stopped or reset; a dedicated executor stops),
        nothing more is sent to it. Returns how many turns moved. The job welcomes it back (a new lease, its
        first version whole) the first ``WELCOMES_AFTER_RETIRE`` times; after that it stays released."""
        rec = self.executors.pop(executor_id, None)
        if rec is None:
            return 0
        self.retirements[executor_id] = self.retirements.get(executor_id, 0) + 1
        moved = self.scheduler.remove_worker(now, executor_id, "retired")
        self.stats.reroutes += len(moved)
        self.stats.retired[executor_id] = reason
        metrics.TURNS_REROUTED.labels("retired").inc(len(moved))
        welcome_back = self.retirements[executor_id] <= WELCOMES_AFTER_RETIRE
        if welcome_back and rec.role == "serving":  # a dedicated executor stops when released
            self.returning.add(executor_id)
        self.release(rec, f"taken out of the job: {reason}", welcome_back=welcome_back)
        self.peers.pop(rec.peer, None)
        log.warning("executor %s taken out of the job (%s); %d turns re-routed; %d executors go on",
                    executor_id, reason, len(moved), len(self.executors))
        self.update_gauge()
        return len(moved)

    def release(self, rec: ExecutorRecord, reason: str, welcome_back: bool = False) -> None:
        """Tell an executor the job is done with it (``Release``); it is not welcomed again unless
        ``welcome_back``."""
        if not welcome_back:
            self.released.add(rec.executor_id)
        self.server.send(rec.peer, m.Release(reason=reason))

    def mark_stalled(self, executor_ids: list[str], stall_timeout_s: float) -> None:
        for executor_id in executor_ids:
            log.warning("executor %s stalled (no heartbeat for %.1fs); its turns are re-routed",
                        executor_id, stall_timeout_s)
            if executor_id in self.executors:
                self.executors[executor_id].state = "stalled"

    def update_gauge(self) -> None:
        metrics.EXECUTORS.clear()
        for rec in self.executors.values():
            metrics.EXECUTORS.labels(rec.role, rec.state).inc()


def _allowed(ok: bool, reason: str, peer: bytes, msg: m.ToController) -> bool:
    if not ok:
        REJECTED_MESSAGES.labels(reason).inc()
        log.warning("rejected %s from %r (%s)", type(msg).__name__, peer[:32], reason)
    return ok
