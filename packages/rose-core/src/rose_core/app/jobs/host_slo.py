"""Production judged where it is served: each serving host's SLO (the one its guard keeps: measured on the
production it served alone with ``[slo] from_alone``, or its operator's fixed budgets) and its count of the
finished production requests over it (vLLM's own request timings), both from the host's heartbeats.

The run report judges by these, not by its own load generator's clock: that client shares a process (and on a
small machine, cores) with the trainer, so its stamps would judge the job's own process as much as serving.
Its client-side p99s are reported beside them. Counters are cumulative per host from the moment its SLO is
known; a step's figure is the difference over the step (as of the hosts' last heartbeats: up to one
heartbeat interval late).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rose_core.app.controller.executor_record import ExecutorRecord


@dataclass(frozen=True, slots=True)
class HostSlo:
    ttft_ms: float
    tpot_ms: float
    basis: str

    def describe(self) -> str:
        return f"TTFT <= {self.ttft_ms:.1f} ms, TPOT <= {self.tpot_ms:.1f} ms ({self.basis})"


def host_slos(records: Iterable[ExecutorRecord]) -> dict[str, HostSlo]:
    """The serving hosts whose SLO is known, by executor id."""
    return {r.executor_id: HostSlo(r.load.slo_ttft_ms, r.load.slo_tpot_ms, r.load.slo_basis)
            for r in records if r.role == "serving" and r.load.slo_ttft_ms > 0}


def measuring(records: Iterable[ExecutorRecord]) -> dict[str, str]:
    """The serving hosts still measuring their SLO, with how far they are."""
    return {r.executor_id: r.load.slo_basis for r in records if r.role == "serving" and r.load.slo_ttft_ms <= 0}


Judged = dict[str, tuple[int, int]]
"""executor id -> (production requests judged, of them over the SLO), cumulative."""


def judged(records: Iterable[ExecutorRecord]) -> Judged:
    return {r.executor_id: (r.load.serving_requests_total, r.load.serving_slo_violations_total)
            for r in records if r.role == "serving"}


def judged_since(now: Judged, before: Judged) -> tuple[int, int]:
    """Requests judged and violations since ``before``, summed over hosts (a host that restarted counts from 0)."""
    requests = violations = 0
    for eid, (req, viol) in now.items():
        req0, viol0 = before.get(eid, (0, 0))
        if req < req0:  # its counters restarted with its process
            req0 = viol0 = 0
        requests += req - req0
        violations += viol - viol0
    return requests, violations
