"""What an executor tells the controller about its load with every heartbeat (``LoadReport``), read from what
its host runs: the rollout runner, the serving-first memory budget, the co-serving guard, the serving monitor."""

from __future__ import annotations

import math
import time

from rose_core.protocol.messages import LoadReport
from rose_executor.agent.host import Host


def load_report(host: Host, state: str) -> LoadReport:
    runner = host.runner
    report = LoadReport(rollout_capacity=host.plan.config.rollout.capacity, state=state, rollout_held=held_turns(host),
                        weight_version=runner.weight_version if runner else -1)
    if runner is not None:
        report.rollout_in_flight = runner.in_flight
        report.rollout_budget_frozen = runner.budget_frozen
        report.rollout_tokens_total = runner.tokens_total
        report.warm_trajectories = runner.warm.ids(time.monotonic())
        report.rollout_aborted_total = runner.aborted_total
        report.prefix_hit_ratio = runner.prefix_hit_rate
        report.revoked = runner.revoked
        report.rollout_cancelled_total = runner.cancelled_total
        report.cancelled_still_running = runner.cancelled_still_running
        if runner.memory is not None:
            report.rollout_budget_bytes = runner.memory.budget_bytes
            report.emergency_cuts_total = runner.memory.policy.cuts
    _add_guard(host, report)
    return report


def host_state(host: Host | None, stopping: bool) -> str:
    """The executor's state in its heartbeats: stopping, revoked, updating, held or ready."""
    runner = host.runner if host else None
    if stopping:
        return "stopping"
    if runner is not None and runner.revoked:
        return "revoked"
    if host is not None and host.updater is not None and host.updater.updating:
        return "updating"
    if runner is not None and runner.held:
        return "held"
    return "ready"


def held_turns(host: Host) -> int:
    """Rollout turns held back here: by the guard on a serving host, queued on a dedicated one."""
    if host.co_serving is not None:
        return host.co_serving.held_turns()
    return len(host.runner.queued()) if host.runner is not None else 0


def _add_guard(host: Host, report: LoadReport) -> None:
    co = host.co_serving
    if co is not None:
        report.guard_hold_seconds_total = co.hold_seconds_total
        slack = co.last.min_slack_s if co.last is not None else math.inf
        report.guard_min_slack_ms = slack * 1000 if math.isfinite(slack) else 0.0
    if host.monitor is not None and host.serving is not None:
        snap = host.monitor.snapshot()
        report.serving_kv_usage_ratio = snap.kv_usage_ratio
        report.serving_ttft_p99_ms = snap.ttft_p99_s * 1000
        report.serving_tpot_p99_ms = snap.tpot_p99_s * 1000
        report.serving_requests_in_flight = host.serving.num_unfinished_requests()
        report.serving_requests_total = host.monitor.requests_total
        report.serving_slo_violations_total = host.monitor.violations_total
        if host.monitor.slo is not None:
            report.slo_ttft_ms = host.monitor.slo.ttft_s * 1000
            report.slo_tpot_ms = host.monitor.slo.tpot_s * 1000
        report.slo_basis = host.monitor.basis()
        report.slo_headroom = co.headroom if co is not None else host.monitor.has_headroom()
