"""The learning curve `rose run` prints at its end: reward, success, eval success and the step phases, one
sparkline mark per step (or per bucket of steps, bucket means, past ``MAX_POINTS`` steps). Pure: no deps.

``learning_curve`` reads ``StepReport``s or the dicts of a report's ``"steps"`` (``RunReport.to_dict``), so a
saved report draws the same curve as the run that wrote it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import fmean, median
from typing import TYPE_CHECKING

from rose_core.support.sparkline import sparkline

if TYPE_CHECKING:
    from rose_core.app.jobs.step_report import StepReport

MAX_POINTS = 36
"""Marks per sparkline: more steps than this are bucketed (the mean of each bucket), so a line stays within about 120 cells."""
WINDOW = 5
"""Steps averaged at each end for the "first 5 mean -> last 5 mean" trend."""
PHASES = (("rollout s", "rollout_seconds"), ("train s", "train_seconds"), ("sync s", "sync_seconds"))

Value = float | None


def bucket_means(values: Sequence[Value], points: int = MAX_POINTS) -> list[Value]:
    """``values`` as at most ``points`` values: consecutive buckets of (nearly) equal size, each the mean of
    its present values (``None`` when it has none)."""
    if points < 1:
        raise ValueError(f"bucket_means needs points >= 1, got {points}")
    n = len(values)
    if n <= points:
        return list(values)
    buckets = (values[i * n // points:(i + 1) * n // points] for i in range(points))
    return [_mean_or_none(b) for b in buckets]


def learning_curve(steps: Sequence[StepReport] | Sequence[Mapping[str, object]]) -> list[str]:
    """Aligned lines: a title, reward and success rate (first -> last value and the first/last 5 means), eval
    success when any step evaluated, and the rollout/train/sync seconds on one shared scale with their medians.
    No lines without steps."""
    if not steps:
        return []
    series = {name: step_values(steps, name) for name in _FIELDS}
    rows: list[tuple[str, ...]] = [("reward", *_trend_cells(series["reward_mean"], None, REWARD_FORMAT))]
    for label, name in (("success", "success_rate"), ("eval success", "eval_success")):
        if any(v is not None for v in series[name]):
            rows.append((label, *_trend_cells(series[name], (0.0, 1.0), RATE_FORMAT)))
    rows.extend(_phase_rows(series))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [_title(len(steps)), *("  " + "  ".join(_pad(row, widths)).rstrip() for row in rows)]


REWARD_FORMAT = ("{:+.3f}", "{:+.3f}")
RATE_FORMAT = ("{:.2f}", "{:+.2f}")
"""How a value and a change of it read: rewards signed to 3 places, rates to 2."""
_FIELDS = ("reward_mean", "success_rate", "eval_success", *(name for _, name in PHASES))


def _title(n: int) -> str:
    if n <= MAX_POINTS:
        return f"learning curve, {n} steps (one mark per step):"
    return f"learning curve, {n} steps (one mark per {n / MAX_POINTS:.1f} steps, their mean):"


def _pad(row: tuple[str, ...], widths: list[int]) -> list[str]:
    return [cell.ljust(w) for cell, w in zip(row, widths, strict=False)] + list(row[len(widths):])


def _trend_cells(values: list[Value], bounds: tuple[float, float] | None,
                 formats: tuple[str, str]) -> tuple[str, str, str]:
    """The sparkline, ``first -> last`` and ``first k mean a -> last k b (+delta)``, k = 5 or fewer so
    the two windows do not overlap."""
    spark = sparkline(bucket_means(values), bounds)
    present = [v for v in values if v is not None]
    if not present:
        return spark, "none", ""
    value, delta = formats
    k = max(1, min(WINDOW, len(present) // 2))
    first, last = fmean(present[:k]), fmean(present[-k:])
    return (spark, f"{value.format(present[0])} -> {value.format(present[-1])}",
            f"first {k} mean {value.format(first)} -> last {k} {value.format(last)} ({delta.format(last - first)})")


def _phase_rows(series: dict[str, list[Value]]) -> list[tuple[str, ...]]:
    """The phases on one scale from 0 (their heights compare), each with its median seconds."""
    phases = [(label, series[name]) for label, name in PHASES if any(v is not None for v in series[name])]
    top = max((v for _, values in phases for v in values if v is not None), default=0.0)
    return [(label, sparkline(bucket_means(values), (0.0, top)),
             f"median {median(v for v in values if v is not None):.2f}", "") for label, values in phases]


def step_values(steps: Sequence[object], name: str) -> list[Value]:
    """One field of every step (``StepReport``s or a report's dicts), ``None`` where a step lacks it."""
    return [_number(s, name) for s in steps]


def _number(step: object, name: str) -> Value:
    """A step's field, from a ``StepReport`` or a report's dict; ``None`` when absent (older reports) or not
    finite (a summary printed at the end of a run does not fail it over one NaN)."""
    value = step.get(name) if isinstance(step, Mapping) else getattr(step, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"step field {name!r} is {value!r}; a learning curve needs a number or null there")
    return float(value) if math.isfinite(value) else None




def _mean_or_none(values: Sequence[Value]) -> Value:
    present = [v for v in values if v is not None]
    return fmean(present) if present else None
