"""What the executor knows about its serving engine's latency, fed by vLLM's stat-logger hook.

``ServingMonitor`` is the ``EngineStatsObserver`` the serving engine calls with vLLM's per-iteration stats;
it keeps a ``LatencyWindow``, counts finished requests and SLO violations, feeds the Prometheus histograms,
and answers whether serving currently has headroom to lend.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rose_executor import metrics
from rose_executor.serving.latency_window import LatencySnapshot, LatencyWindow


def has_headroom(snapshot: LatencySnapshot, slo_ttft_s: float, slo_tpot_s: float, fraction: float) -> bool:
    """True while the recent TTFT and TPOT p99 both stay below ``fraction`` of their SLO."""
    return snapshot.ttft_p99_s < fraction * slo_ttft_s and snapshot.tpot_p99_s < fraction * slo_tpot_s


class ServingMonitor:
    """Rolling serving latency, totals and the headroom verdict of one serving engine."""

    def __init__(
        self,
        slo_ttft_s: float,
        slo_tpot_s: float,
        headroom_fraction: float,
        horizon_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slo_ttft_s <= 0 or slo_tpot_s <= 0:
            raise ValueError("SLO budgets must be > 0")
        if not 0 < headroom_fraction <= 1:
            raise ValueError(f"headroom_fraction must be in (0, 1] (got {headroom_fraction})")
        self.slo_ttft_s = slo_ttft_s
        self.slo_tpot_s = slo_tpot_s
        self.headroom_fraction = headroom_fraction
        self.window = LatencyWindow(horizon_s)
        self.requests_total = 0
        self.violations_total = 0
        self._clock = clock

    def on_iteration(
        self, ttfts: Sequence[float], tpots: Sequence[float], finished: Sequence[tuple[float, float]]
    ) -> None:
        now = self._clock()
        for value in ttfts:
            self.window.add_ttft(now, value)
            metrics.SERVING_TTFT.observe(value)
        for value in tpots:
            self.window.add_tpot(now, value)
            metrics.SERVING_TPOT.observe(value)
        for ttft, tpot in finished:
            self.requests_total += 1
            if ttft > self.slo_ttft_s or tpot > self.slo_tpot_s:
                self.violations_total += 1
                metrics.SERVING_SLO_VIOLATIONS.inc()
        if finished:
            metrics.SERVING_SLO_ATTAINMENT.set(1 - self.violations_total / self.requests_total)

    def on_scheduler(self, kv_usage_ratio: float) -> None:
        self.window.set_kv_usage(self._clock(), kv_usage_ratio)

    def snapshot(self) -> LatencySnapshot:
        return self.window.snapshot(self._clock())

    def has_headroom(self) -> bool:
        return has_headroom(self.snapshot(), self.slo_ttft_s, self.slo_tpot_s, self.headroom_fraction)
