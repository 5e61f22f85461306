"""Production requests as a job reports them: each request's client-side latency (``ServingSample``), a step's
window of them judged against the SLO (``ServingWindow``), and what a job reads them from (``ServingTraffic``:
the launcher's load generator, ``rose_core.app.run.load_generator``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True, frozen=True)
class ServingSample:
    arrived: float
    ttft_s: float
    tpot_s: float
    tokens: int
    ok: bool
    endpoint: int = 0
    """Index of the endpoint it went to."""


@dataclass(slots=True, frozen=True)
class ServingWindow:
    requests: int
    failed: int
    ttft_p99_ms: float
    tpot_p99_ms: float
    slo_violations: int


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize(samples: list[ServingSample], slo_ttft_ms: float, slo_tpot_ms: float) -> ServingWindow:
    good = [s for s in samples if s.ok]
    violations = sum(
        1 for s in samples if not s.ok or s.ttft_s * 1e3 > slo_ttft_ms or s.tpot_s * 1e3 > slo_tpot_ms
    )
    return ServingWindow(
        requests=len(samples),
        failed=len(samples) - len(good),
        ttft_p99_ms=percentile([s.ttft_s * 1e3 for s in good], 0.99),
        tpot_p99_ms=percentile([s.tpot_s * 1e3 for s in good if s.tokens > 1], 0.99),
        slo_violations=violations,
    )


class ServingTraffic(Protocol):
    """Production traffic a job can judge per step (the load generator of `rose run`)."""

    def window(self, t0: float, t1: float, slo_ttft_ms: float, slo_tpot_ms: float) -> ServingWindow: ...
