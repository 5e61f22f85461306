"""The serving SLO measured on this host, not guessed: ``[slo] from_alone`` x the p99 TTFT and p99 TPOT of the
first ``[slo] calibration_requests`` production requests the host finishes while it lends nothing (vLLM's own
request timings: the figures it then judges every request by, and the guard keeps).

Invariants: requests are added only while the rollout side runs nothing: between leases (the calibration is
then the serving engine's stats observer itself, detached while a lease starts) and, within a lease, while the
guard holds every turn until the budgets exist (``CoServing``); once ``budgets`` answers it never changes, and
the host keeps it for every later lease (one calibration per host process).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from rose_core.policy import SloBudgets
from rose_executor import metrics

log = logging.getLogger(__name__)


class AloneCalibration:
    def __init__(self, multiple: float, requests: int) -> None:
        if not multiple > 0 or requests < 1:
            raise ValueError("calibration needs a multiple > 0 and at least one request")
        self.multiple = multiple
        self.requests = requests
        self._ttfts: list[float] = []
        self._tpots: list[float] = []
        self._budgets: SloBudgets | None = None

    def add(self, ttft_s: float, tpot_s: float) -> SloBudgets | None:
        """One finished production request served alone; the budgets once this one completes the set."""
        if self._budgets is not None or not (math.isfinite(ttft_s) and math.isfinite(tpot_s)):
            return None
        self._ttfts.append(ttft_s)
        self._tpots.append(tpot_s)
        if len(self._ttfts) < self.requests:
            return None
        self._budgets = budgets = SloBudgets(self.multiple * self.ttft_p99_s, self.multiple * self.tpot_p99_s)
        publish(budgets)
        log.info("serving SLO measured: TTFT %.1f ms, TPOT %.1f ms = %s; the guard lends from now on",
                 budgets.ttft_s * 1e3, budgets.tpot_s * 1e3, self.basis())
        return budgets

    def on_iteration(
        self, ttfts: Sequence[float], tpots: Sequence[float], finished: Sequence[tuple[float, float]]
    ) -> None:
        """The serving engine's stats observer between leases: production served alone."""
        for ttft, tpot in finished:
            self.add(ttft, tpot)

    def on_scheduler(self, kv_usage_ratio: float) -> None:
        """Nothing: the calibration reads finished requests only."""

    def budgets(self) -> SloBudgets | None:
        return self._budgets

    @property
    def seen(self) -> int:
        return len(self._ttfts)

    @property
    def ttft_p99_s(self) -> float:
        return p99(self._ttfts)

    @property
    def tpot_p99_s(self) -> float:
        return p99(self._tpots)

    def basis(self) -> str:
        """How the budgets were set, for the operator and the job's report."""
        if self._budgets is None:
            return f"calibrating: {self.seen} of {self.requests} production requests served alone"
        return (f"{self.multiple:g} x serving alone's p99 over {self.requests} production requests "
                f"(TTFT {self.ttft_p99_s * 1e3:.1f} ms, TPOT {self.tpot_p99_s * 1e3:.1f} ms)")


def p99(values: list[float]) -> float:
    """The 99th percentile, nearest rank (the value at or above 99% of the sample)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def publish(slo: SloBudgets) -> None:
    """The budgets this host keeps, as metrics (0 until known)."""
    metrics.SLO_TTFT_BUDGET.set(slo.ttft_s)
    metrics.SLO_TPOT_BUDGET.set(slo.tpot_s)
