"""What the executor knows about its serving engine's latency, fed by vLLM's stat-logger hook.

``ServingMonitor`` is the ``EngineStatsObserver`` the serving engine calls with vLLM's per-iteration stats;
it keeps a ``LatencyWindow``, counts finished requests and SLO violations, feeds the Prometheus histograms,
and answers whether serving currently has headroom to lend. Its SLO is fixed (the config's, or from the
profile) or measured (``AloneCalibration``: the first production requests it sees set it; until then it
judges nothing and reports no headroom).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rose_core.policy import SloBudgets
from rose_executor import metrics
from rose_executor.serving.alone_calibration import AloneCalibration, publish
from rose_executor.serving.latency_window import LatencySnapshot, LatencyWindow


def has_headroom(snapshot: LatencySnapshot, slo_ttft_s: float, slo_tpot_s: float, fraction: float) -> bool:
    """True while the recent TTFT and TPOT p99 both stay below ``fraction`` of their SLO."""
    return snapshot.ttft_p99_s < fraction * slo_ttft_s and snapshot.tpot_p99_s < fraction * slo_tpot_s


class ServingMonitor:
    """Rolling serving latency, totals and the headroom verdict of one serving engine."""

    def __init__(
        self,
        slo: SloBudgets | AloneCalibration,
        headroom_fraction: float,
        horizon_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        basis: str = "the executor's [slo] ttft_ms and tpot_ms",
    ) -> None:
        """``basis``: how a fixed ``slo`` was set (a calibration says it itself)."""
        if isinstance(slo, SloBudgets) and (slo.ttft_s <= 0 or slo.tpot_s <= 0):
            raise ValueError("SLO budgets must be > 0")
        if not 0 < headroom_fraction <= 1:
            raise ValueError(f"headroom_fraction must be in (0, 1] (got {headroom_fraction})")
        self.calibration = slo if isinstance(slo, AloneCalibration) else None
        self.slo: SloBudgets | None = slo if isinstance(slo, SloBudgets) else slo.budgets()
        self.headroom_fraction = headroom_fraction
        self.window = LatencyWindow(horizon_s)
        self.requests_total = 0
        """Finished requests judged against the SLO (from the moment it is known)."""
        self.violations_total = 0
        self._clock = clock
        self._basis = basis
        if self.slo is not None:
            publish(self.slo)

    def basis(self) -> str:
        return self.calibration.basis() if self.calibration is not None else self._basis

    def on_iteration(
        self, ttfts: Sequence[float], tpots: Sequence[float], finished: Sequence[tuple[float, float]]
    ) -> None:
        now = self._clock()
        for value in ttfts:
            self.window.add_ttft(now, value)
            metrics.SERVING_TTFT.observe(value)
        for value in tpots:
            metrics.SERVING_TPOT.observe(value)
        for ttft, tpot in finished:
            self.window.add_tpot(now, tpot)  # the SLO's TPOT (a request's mean), not one token's gap
            if self.slo is None:
                self._calibrate(ttft, tpot)
                continue
            self.requests_total += 1
            if ttft > self.slo.ttft_s or tpot > self.slo.tpot_s:
                self.violations_total += 1
                metrics.SERVING_SLO_VIOLATIONS.inc()
        if finished and self.requests_total:
            metrics.SERVING_SLO_ATTAINMENT.set(1 - self.violations_total / self.requests_total)

    def _calibrate(self, ttft: float, tpot: float) -> None:
        if self.calibration is not None:
            self.slo = self.calibration.add(ttft, tpot)

    def on_scheduler(self, kv_usage_ratio: float) -> None:
        self.window.set_kv_usage(self._clock(), kv_usage_ratio)

    def snapshot(self) -> LatencySnapshot:
        return self.window.snapshot(self._clock())

    def has_headroom(self) -> bool:
        """False while the SLO is still being measured (nothing may be lent before it is known)."""
        if self.slo is None:
            return False
        return has_headroom(self.snapshot(), self.slo.ttft_s, self.slo.tpot_s, self.headroom_fraction)
