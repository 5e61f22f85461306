"""Serving latency on the borrowed GPUs during a run's rollout phases, from the co-serving table.

Requests in one second are proportional to that second's load multiplier; each load level has the p99-prompt
TTFT and the TPOT of the co-serving table (with the admitted rollout for ``rose``, serving alone for every
other system: they never touch the serving fleet). Percentiles are request-weighted over all seconds of all
borrowed GPUs inside the windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rose_core.app.sim.sim_environment import SimEnvironment


@dataclass(slots=True, frozen=True)
class ServingLatency:
    ttft_p99_ms: float
    tpot_p99_ms: float
    violation_ratio: float


def _weighted_p99(values: np.ndarray, weights: np.ndarray) -> float:
    if weights.sum() <= 0:
        return 0.0
    order = np.argsort(values)
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(len(order) - 1, int(np.searchsorted(cum, 0.99)))])


class ServingStats:
    def __init__(self, env: SimEnvironment, co_serving: bool) -> None:
        levels = env.table.levels
        self.env = env
        self.ttft = np.array([lv.ttft_rose_s if co_serving else lv.ttft_alone_s for lv in levels]) * 1000
        self.tpot = np.array([lv.tpot_rose_s if co_serving else lv.tpot_alone_s for lv in levels]) * 1000
        sv = env.scenario.serving
        self.violating = (self.ttft > sv.ttft_slo_ms) | (self.tpot > sv.tpot_slo_ms)

    def histogram(self, gpus: Sequence[tuple[int, float]], windows: Sequence[tuple[float, float]]) -> np.ndarray:
        """Requests per load level over ``gpus`` (class, offset) inside ``windows`` (start, end)."""
        hist = np.zeros(len(self.ttft))
        for cls_idx, offset in gpus:
            cls = self.env.classes[cls_idx]
            for start, end in windows:
                idx = np.arange(int(start + offset), int(end + offset) + 1)
                hist += np.bincount(np.take(cls.bins, idx, mode="wrap"),
                                    weights=np.take(cls.multipliers, idx, mode="wrap"), minlength=len(hist))
        return hist

    def latency(self, hist: np.ndarray) -> ServingLatency:
        total = hist.sum()
        ratio = float(hist[self.violating].sum() / total) if total > 0 else 0.0
        return ServingLatency(_weighted_p99(self.ttft, hist), _weighted_p99(self.tpot, hist), ratio)
