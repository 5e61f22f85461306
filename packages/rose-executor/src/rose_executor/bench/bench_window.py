"""The bench's pure arithmetic: one measured window, the SLO budgets from serving alone, attainment and the
harvest ratio of a window, and the summary over repeats."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVELS = {"low": 0.2, "medium": 0.5, "high": 0.8}
CONFIGS = ("alone", "unguarded", "guarded")
HARVEST_KEYS = ("harvest_ratio", "harvest_ratio_unguarded")


@dataclass(frozen=True, slots=True)
class Window:
    """One measured configuration at one load level."""

    ttft_p99_s: float
    tpot_p99_s: float
    rollout_tokens_per_s: float
    finished: list[tuple[float, float]]
    """(TTFT, mean TPOT) of every finished serving request."""
    itls: list[float]
    """Every inter-token latency."""
    serving_device_share: float = 0.0
    """Serving workers' CPU seconds / window seconds: the share of the device serving used."""
    rollout_device_share: float = 0.0
    """The same for the rollout engine's workers."""

    def row(self, slo_ttft: float, slo_tpot: float) -> dict[str, float]:
        return {
            "serving_ttft_p99_ms": self.ttft_p99_s * 1e3,
            "serving_tpot_p99_ms": self.tpot_p99_s * 1e3,
            "slo_attainment": attainment(self.finished, slo_ttft, slo_tpot),
            "rollout_tokens_per_s": self.rollout_tokens_per_s,
            "requests": float(len(self.finished)),
            "ttft_violations": float(sum(1 for t, _ in self.finished if t > slo_ttft)),
            "tpot_violations": float(sum(1 for _, m in self.finished if m > slo_tpot)),
            "serving_device_share": self.serving_device_share,
            "rollout_device_share": self.rollout_device_share,
        }


def slo_from_alone(windows: Iterable[Window], multiple: float, ttft_floor_extra_s: float = 0.0) -> tuple[float, float]:
    """SLO budgets: ``multiple`` x the typical serving-alone p99, the median over the windows (every level of
    every calibration pass) of each window's TTFT and inter-token p99 (on a shared noisy host one window's p99
    can be a single outlier burst of another tenant; the median ignores it). The TTFT budget is at least that
    p99 plus ``ttft_floor_extra_s`` (the guard's margin: the rollout step a hold cannot stop, and the device's
    wait): no co-location that cannot preempt a step keeps a tighter one (``CoServingGuard.ttft_floor_s``)."""
    pooled = list(windows)
    ttft = float(np.median([w.ttft_p99_s for w in pooled]))
    return (
        max(multiple * ttft, ttft + ttft_floor_extra_s),
        multiple * float(np.median([w.tpot_p99_s for w in pooled])),
    )


def p99(values: Sequence[float]) -> float:
    return float(np.percentile(np.asarray(values), 99)) if values else 0.0


def harvest_ratio(window: Window) -> float:
    """The share of the device time serving left in this window that the rollout engine used:
    rollout device share / (1 - serving device share). Both engines' workers compute on the same cores, so the
    two shares sum to at most 1 and the ratio cannot exceed 1."""
    leftover = 1.0 - window.serving_device_share
    return window.rollout_device_share / leftover if leftover > 0.0 else 0.0


def attainment(finished: Sequence[tuple[float, float]], ttft: float, tpot: float) -> float:
    ok = sum(1 for t, m in finished if t <= ttft and m <= tpot)
    return ok / len(finished) if finished else 1.0


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median over repeats of every metric (the issue's JSON shape), min / max under ``spread``, and the
    attainment over all requests of all repeats under ``pooled_slo_attainment``."""
    levels: dict[str, Any] = {}
    spread: dict[str, Any] = {}
    pooled: dict[str, Any] = {}
    for name in LEVELS:
        rows = [run["levels"][name] for run in runs]
        levels[name], spread[name], pooled[name] = {}, {}, {}
        for config in CONFIGS:
            metrics = rows[0][config].keys()
            levels[name][config] = {m: median([r[config][m] for r in rows]) for m in metrics}
            spread[name][config] = {m: [min(r[config][m] for r in rows), max(r[config][m] for r in rows)]
                                    for m in metrics}  # fmt: skip
            requests = sum(r[config]["requests"] for r in rows)
            ok = sum(r[config]["slo_attainment"] * r[config]["requests"] for r in rows)
            pooled[name][config] = ok / requests if requests else 1.0
        for key in HARVEST_KEYS:
            values = [r[key] for r in rows]
            levels[name][key] = median(values)
            spread[name][key] = [min(values), max(values)]
    return {
        "levels": levels,
        "rollout_alone_tokens_per_s": median([run["rollout_alone_tokens_per_s"] for run in runs]),
        "rollout_alone_device_share": median([run["rollout_alone_device_share"] for run in runs]),
        "spread": spread,
        "pooled_slo_attainment": pooled,
    }


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))
