"""The "learning" panel's model: reward, success, eval success and the step phases over the finished steps
(``StatusSnapshot.history``) as sparklines. Pure: no Textual; ``LearningView.lines(width)`` fits them to a width
by keeping the newest steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rose_core.protocol.messages import StepStatus
from rose_core.support.sparkline import sparkline
from rose_tui.formatting import DASH, format_ratio, format_reward

Value = float | None
RATE_BOUNDS = (0.0, 1.0)
PHASES = (("rollout s", "rollout_seconds"), ("train s", "train_seconds"), ("sync s", "sync_seconds"))


@dataclass(frozen=True, slots=True)
class LearningRow:
    """One series, oldest step first; ``bounds`` fixes its scale (``None``: the shown values' min and max)."""

    label: str
    values: tuple[Value, ...]
    bounds: tuple[float, float] | None
    value: str
    """The newest step's value as shown at the end of the line."""


@dataclass(frozen=True, slots=True)
class LearningView:
    rows: tuple[LearningRow, ...] = ()
    steps: int = 0

    @property
    def title(self) -> str:
        return f"learning ({self.steps} steps)" if self.steps else "learning"

    def lines(self, width: int) -> tuple[str, ...]:
        """``label spark value`` per row in ``width`` cells: as many of the newest steps as fit, one mark each."""
        if not self.rows:
            return ("no finished step yet",)
        label_w = max(len(r.label) for r in self.rows)
        value_w = max(len(r.value) for r in self.rows)
        points = max(0, min(self.steps, width - label_w - value_w - 2))
        return tuple(
            f"{r.label.ljust(label_w)} {sparkline(r.values[len(r.values) - points:], r.bounds)} {r.value.rjust(value_w)}"
            for r in self.rows
        )


def learning_view(history: Sequence[StepStatus]) -> LearningView:
    """Rows for the series some step has: reward, success, eval success (spaces where a step did not
    evaluate), then the phases on one scale from 0 so their heights compare."""
    if not history:
        return LearningView()
    rows = [_row("reward", [s.reward_mean for s in history], None, format_reward)]
    for label, values in (("success", [s.success_rate for s in history]), ("eval", [s.eval_success for s in history])):
        if any(v is not None for v in values):
            rows.append(_row(label, values, RATE_BOUNDS, _rate_text))
    phases = [(label, [_finite(getattr(s, name)) for s in history]) for label, name in PHASES]
    top = max(v for _, values in phases for v in values)
    rows.extend(_row(label, values, (0.0, top), _seconds_text) for label, values in phases if any(values))
    return LearningView(tuple(rows), len(history))


def _row(
    label: str, values: Sequence[Value], bounds: tuple[float, float] | None, text: Callable[[Value], str]
) -> LearningRow:
    """A non-finite value (a controller's NaN) is shown as a missing one rather than failing the dashboard."""
    shown = tuple(v if v is not None and math.isfinite(v) else None for v in values)
    present = [v for v in shown if v is not None]
    return LearningRow(label, shown, bounds, text(present[-1]) if present else DASH)


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def _rate_text(value: float | None) -> str:
    return DASH if value is None else format_ratio(value)


def _seconds_text(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}"

