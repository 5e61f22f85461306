"""Production serving traffic as a per-second load multiplier (mean 1) over a 24-hour cycle.

``synthetic``: a diurnal curve times per-minute noise times heavy-tailed per-second bursts, calibrated (by
bisection on the burst spread and the diurnal swing) so that the per-second peak / mean and per-minute
peak / mean match the paper's reading of the 24-hour Azure LLM inference trace (4.22 and 1.7).
``azure-csv``: the public Azure LLM inference trace format (``TIMESTAMP,ContextTokens,GeneratedTokens``),
binned per second.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from rose_core.support.errors import ConfigError

DAY_S = 86_400


@dataclass(slots=True, frozen=True)
class Traffic:
    per_second: np.ndarray
    """Load multiplier per second, mean 1."""
    prompt_tokens_mean: float
    output_tokens_mean: float

    def peak_to_mean(self, window_s: int) -> float:
        n = len(self.per_second) // window_s
        windows = self.per_second[: n * window_s].reshape(n, window_s).mean(axis=1)
        return float(windows.max() / windows.mean())


def _shape(rng_seed: int, burst_sigma: float, swing: float) -> np.ndarray:
    rng = np.random.default_rng(rng_seed)
    t = np.arange(DAY_S)
    diurnal = 1 + swing * np.sin(2 * np.pi * t / DAY_S - np.pi / 2)
    minute = np.repeat(rng.lognormal(0.0, 0.08, DAY_S // 60), 60)
    burst = rng.lognormal(-burst_sigma**2 / 2, burst_sigma, DAY_S)
    series: np.ndarray = diurnal * minute * burst
    return series / float(series.mean())


def _bisect(lo: float, hi: float, measure: Callable[[float], float], target: float) -> float:
    for _ in range(20):
        mid = (lo + hi) / 2
        if measure(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@functools.lru_cache(maxsize=8)
def synthetic_traffic(seed: int, second_peak: float, minute_peak: float, prompt_mean: float,
                      output_mean: float) -> Traffic:
    """Alternate bisections on the diurnal swing and the burst spread until both peak ratios match."""
    swing, sigma = 0.5, 0.5

    def per_minute(x: float) -> float:
        return Traffic(_shape(seed, sigma, x), 1, 1).peak_to_mean(60)

    def per_second(x: float) -> float:
        return Traffic(_shape(seed, x, swing), 1, 1).peak_to_mean(1)

    for _ in range(3):  # each closure reads the other parameter's latest value
        swing = _bisect(0.0, 0.95, per_minute, minute_peak)
        sigma = _bisect(0.0, 1.5, per_second, second_peak)
    return Traffic(_shape(seed, sigma, swing), prompt_mean, output_mean)


def _timestamp(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text.strip()[:26]).timestamp()


def load_azure_trace(path: str | Path) -> Traffic:
    """Requests per second of an Azure LLM inference trace CSV, as a mean-1 multiplier."""
    times: list[float] = []
    prompt = output = 0.0
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                times.append(_timestamp(row["TIMESTAMP"]))
                prompt += float(row["ContextTokens"])
                output += float(row["GeneratedTokens"])
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"trace {path}: cannot read it as TIMESTAMP,ContextTokens,GeneratedTokens ({exc})") from exc
    if len(times) < 2:
        raise ConfigError(f"trace {path}: needs at least 2 requests")
    start = math.floor(min(times))
    seconds = np.array([math.floor(t) - start for t in times])
    counts = np.bincount(seconds).astype(float)
    return Traffic(counts / counts.mean(), prompt / len(times), output / len(times))
