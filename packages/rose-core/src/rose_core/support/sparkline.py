"""Sparklines: one block character per value, scaled between bounds. Pure text, no dependencies (the learning
curve `rose run` prints and the dashboard's learning panel draw with it)."""

from __future__ import annotations

import math
from collections.abc import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], bounds: tuple[float, float] | None = None) -> str:
    """One block character per value, scaled between ``bounds`` (default: the values' min and max); ``None`` is
    a space, a constant series sits at mid height, values outside ``bounds`` are clipped."""
    present = [_finite(i, v) for i, v in enumerate(values) if v is not None]
    if not present:
        return " " * len(values)
    lo, hi = bounds if bounds is not None else (min(present), max(present))
    return "".join(" " if v is None else _block(v, lo, hi) for v in values)


def _finite(index: int, value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"sparkline value {index} is {value}: pass None for a missing value, not NaN or inf")
    return value


def _block(value: float, lo: float, hi: float) -> str:
    if hi <= lo:
        return BLOCKS[len(BLOCKS) // 2 - 1]
    frac = min(1.0, max(0.0, (value - lo) / (hi - lo)))
    return BLOCKS[round(frac * (len(BLOCKS) - 1))]
