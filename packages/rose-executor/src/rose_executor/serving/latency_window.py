"""Rolling serving latency over the last N seconds: TTFT and TPOT percentiles, KV usage (time-averaged).

Pure: every method takes ``now`` (seconds, any monotonic clock), so the same object works under the wall
clock and under simulated time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from rose_executor.serving.time_average import TimeAverage


@dataclass(frozen=True, slots=True)
class LatencySnapshot:
    """Percentiles of the samples inside the window, in seconds; 0.0 where the window holds none."""

    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    ttft_samples: int
    tpot_samples: int
    kv_usage_ratio: float
    """The KV cache use, time-averaged over the window (what borrowing ranks serving hosts by)."""


class LatencyWindow:
    """Time-to-first-token and time-per-output-token samples younger than ``horizon_s``."""

    __slots__ = ("_kv_usage", "_max_samples", "_tpot", "_ttft", "horizon_s")

    def __init__(self, horizon_s: float = 10.0, max_samples: int = 8192) -> None:
        if horizon_s <= 0:
            raise ValueError(f"horizon_s must be > 0 (got {horizon_s})")
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1 (got {max_samples})")
        self.horizon_s = horizon_s
        self._max_samples = max_samples
        self._ttft: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self._tpot: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self._kv_usage = TimeAverage(horizon_s)

    def add_ttft(self, now: float, seconds: float) -> None:
        self._ttft.append((now, seconds))

    def add_tpot(self, now: float, seconds: float) -> None:
        self._tpot.append((now, seconds))

    def set_kv_usage(self, now: float, ratio: float) -> None:
        self._kv_usage.set(now, min(max(ratio, 0.0), 1.0))

    def snapshot(self, now: float) -> LatencySnapshot:
        ttft = self._recent(self._ttft, now)
        tpot = self._recent(self._tpot, now)
        return LatencySnapshot(
            ttft_p50_s=_percentile(ttft, 50),
            ttft_p99_s=_percentile(ttft, 99),
            tpot_p50_s=_percentile(tpot, 50),
            tpot_p99_s=_percentile(tpot, 99),
            ttft_samples=len(ttft),
            tpot_samples=len(tpot),
            kv_usage_ratio=self._kv_usage.mean(now),
        )

    def _recent(self, samples: deque[tuple[float, float]], now: float) -> list[float]:
        cutoff = now - self.horizon_s
        while samples and samples[0][0] < cutoff:
            samples.popleft()
        return [value for _, value in samples]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))
