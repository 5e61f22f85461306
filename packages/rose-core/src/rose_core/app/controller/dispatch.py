"""Turns between the job and the executors.

Submitted turns go to the elastic scheduler; every control tick re-routes what stalled, ran over
``turn_timeout_s`` or is held back on a borrowed serving executor, sends the cancellations those re-routes
leave, and sends what the scheduler routes now. Results and aborts come back as the scheduler's verdicts: a
result is accepted once (the latest attempt, from the executor running it); everything else is counted late.
A result that fails the checks of ``result_check`` is refused: its turn failed on that executor (the scheduler
tries it elsewhere, a bounded number of times); turns given up reach the job through ``take_given_up``.
"""

from __future__ import annotations

import logging

from rose_core.app.config import RunConfig
from rose_core.app.controller import controller_metrics as metrics
from rose_core.app.controller.controller_stats import ControllerStats
from rose_core.app.controller.job_hooks import AcceptedTurn, TurnPayload
from rose_core.app.controller.registry import ExecutorRegistry
from rose_core.app.controller.result_check import result_problem
from rose_core.protocol.messages import CancelTurn, TurnAborted, TurnRequest, TurnResult
from rose_core.scheduler import ElasticScheduler, GivenUp, TurnTicket
from rose_core.transport.control_endpoint import ServerEndpoint

log = logging.getLogger(__name__)


class TurnDispatch:
    def __init__(self, scheduler: ElasticScheduler, registry: ExecutorRegistry, server: ServerEndpoint,
                 config: RunConfig, stats: ControllerStats) -> None:
        self.scheduler = scheduler
        self.registry = registry
        self.server = server
        self.config = config
        self.stats = stats

    def submit(self, now: float, ticket: TurnTicket) -> None:
        self.scheduler.submit(now, ticket)

    def tick(self, now: float) -> None:
        cc = self.config.controller
        self.registry.mark_stalled(self.scheduler.find_stalled(now, cc.stall_timeout_s), cc.stall_timeout_s)
        self._reroute_overdue(now)
        self._move_held(now)

    def route(self, now: float) -> None:
        """Send the cancellations re-routes left, then every turn the scheduler routes now."""
        for cancel in self.scheduler.take_cancellations():
            rec = self.registry.executors.get(cancel.worker_id)
            if rec is not None:  # a stalled executor that comes back must not finish a re-routed attempt
                self.server.send(rec.peer, CancelTurn(turn_id=cancel.turn_id, attempt=cancel.attempt))
        for assignment in self.scheduler.schedule(now):
            if assignment.detail:
                log.info("turn %s -> %s (%s: %s)", assignment.ticket.turn_id, assignment.worker_id,
                         assignment.reason, assignment.detail)
            self._send(assignment.ticket, assignment.worker_id, assignment.reason)
        metrics.QUEUED_TURNS.set(len(self.scheduler.queue))
        metrics.RUNNING_TURNS.set(self.scheduler.running)

    def _reroute_overdue(self, now: float) -> None:
        timeout = self.config.controller.turn_timeout_s
        for worker_id, ticket in self.scheduler.find_overdue(now, timeout) if timeout > 0 else ():
            self.stats.reroutes += 1
            self.stats.overdue += 1
            metrics.TURNS_REROUTED.labels("overdue").inc()
            log.warning("turn %s ran over %.0f s on %s (it still heartbeats); re-routed and cancelled there",
                        ticket.turn_id, timeout, worker_id)

    def _move_held(self, now: float) -> None:
        after = self.config.scheduler.move_held_after_s
        for worker_id, ticket in self.scheduler.find_held(now, after) if after > 0 else ():
            self.stats.reroutes += 1
            self.stats.held_moved += 1
            metrics.TURNS_REROUTED.labels("held").inc()
            log.info("turn %s held back on %s for over %.1f s while a dedicated executor has room: moved there "
                     "and cancelled on %s", ticket.turn_id, worker_id, after, worker_id)

    def on_result(self, now: float, msg: TurnResult) -> AcceptedTurn | None:
        """The turn's accepted result, or None (a late, duplicate or refused one: counted and discarded)."""
        ticket = self.scheduler.running_ticket(msg.turn_id)
        reason, detail = result_problem(msg, ticket) if ticket is not None else ("", "")
        if reason:
            self._refuse(now, msg, reason, detail)
            return None
        verdict = self.scheduler.complete(now, msg.executor_id, msg.turn_id, msg.attempt)
        if verdict != "accepted" or ticket is None:
            self.stats.late_results += 1
            metrics.LATE_RESULTS.inc()
            log.info("discarded a %s result of turn %s attempt %d", verdict, msg.turn_id, msg.attempt)
            return None
        rec = self.registry.executors.get(msg.executor_id)
        role = rec.role if rec else "dedicated"
        if rec:
            rec.turns_done += 1
        prompt = len(ticket.payload.prompt_token_ids) if isinstance(ticket.payload, TurnPayload) else 0
        self.stats.count_accepted(role, prompt, msg.prefix_hit_tokens)
        metrics.TURNS_COMPLETED.labels(role).inc()
        return AcceptedTurn(msg, ticket, role)

    def _refuse(self, now: float, msg: TurnResult, reason: str, detail: str) -> None:
        self.stats.refused_results[reason] = self.stats.refused_results.get(reason, 0) + 1
        metrics.REFUSED_RESULTS.labels(reason).inc()
        if sum(self.stats.refused_results.values()) <= 20:  # then the metric says how many (a broken peer is loud)
            log.warning("refused the result of turn %s attempt %d from %s (%s: %s)", msg.turn_id, msg.attempt,
                        msg.executor_id, reason, detail)
        self.scheduler.abort(now, msg.executor_id, msg.turn_id, msg.attempt, f"invalid_result: {reason}")

    def take_given_up(self) -> list[GivenUp]:
        """Turns that failed on executors more often than ``scheduler.turn_retries`` allows (or on every one):
        counted; their jobs drop their trajectories."""
        given_up = self.scheduler.take_given_up()
        for gone in given_up:
            self.stats.turns_given_up += 1
            metrics.TURNS_GIVEN_UP.inc()
            log.warning("turn %s failed on %s (last: %s): given up, its trajectory is dropped",
                        gone.ticket.turn_id, ", ".join(gone.ticket.failed_on), gone.reason)
        return given_up

    def on_aborted(self, now: float, msg: TurnAborted) -> None:
        if self.scheduler.abort(now, msg.executor_id, msg.turn_id, msg.attempt, msg.reason) and \
                not self.scheduler.is_done(msg.turn_id):  # (done: given up, see take_given_up)
            self.stats.reroutes += 1
            metrics.TURNS_REROUTED.labels(msg.reason.split(":")[0]).inc()
            log.info("turn %s aborted on %s (%s); re-routed", msg.turn_id, msg.executor_id, msg.reason)

    def _send(self, ticket: TurnTicket, worker_id: str, reason: str) -> None:
        payload: TurnPayload = ticket.payload
        rec = self.registry.executors[worker_id]
        self.server.send(rec.peer, TurnRequest(
            turn_id=ticket.turn_id, trajectory_id=ticket.trajectory_id, attempt=ticket.attempt,
            prompt_token_ids=payload.prompt_token_ids, sampling=payload.sampling,
            min_version=ticket.min_version, max_version=ticket.max_version, step=payload.step))
        metrics.TURNS_ROUTED.labels(reason).inc()
        log.debug("turn %s (attempt %d) -> %s (%s)", ticket.turn_id, ticket.attempt, worker_id, reason)
