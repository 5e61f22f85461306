"""`rose run --plot FILE.png`: reward (and eval success), success rate and the stacked step phases per step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rose_core.app.run.learning_curve import PHASES, step_values
from rose_core.support.errors import require_extra

if TYPE_CHECKING:
    from rose_core.app.jobs.step_report import StepReport

PHASE_COLORS = ("tab:blue", "tab:orange", "tab:green")


def pyplot() -> Any:
    """matplotlib's pyplot on the file backend; call it before a long run so a missing extra fails first."""
    with require_extra("matplotlib (for --plot)", "'rose-core[sim]'"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    return plt


def plot_run(steps: Sequence[StepReport] | Sequence[Mapping[str, object]], path: Path) -> None:
    """Three panels over the steps (``StepReport``s or a report's ``"steps"`` dicts), written as a PNG."""
    if not steps:
        raise ValueError("plot_run needs at least one step: the run reported none, so there is nothing to plot")
    plt = pyplot()
    x = [int(v) if v is not None else i for i, v in enumerate(step_values(steps, "step"))]
    fig, (reward, success, phases) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    _reward_panel(reward, x, steps)
    _rate_panel(success, x, step_values(steps, "success_rate"))
    _phase_panel(phases, x, steps)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _reward_panel(ax: Any, x: list[int], steps: Sequence[Any]) -> None:
    ax.plot(x, _nan_for_none(step_values(steps, "reward_mean")), marker="o", label="reward mean")
    ax.set_title("reward per step")
    ax.set_ylabel("reward")
    evals = [(s, v) for s, v in zip(x, step_values(steps, "eval_success"), strict=True) if v is not None]
    if evals:
        right = ax.twinx()
        right.plot(*zip(*evals, strict=True), marker="s", color="tab:red", linestyle="--", label="eval success")
        right.set_ylim(-0.05, 1.05)
        right.set_ylabel("eval success (held-out maps)")
        right.legend(loc="lower right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)


def _rate_panel(ax: Any, x: list[int], rates: list[float | None]) -> None:
    ax.plot(x, _nan_for_none(rates), marker="o", color="tab:purple")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("success rate (trajectories that reached the goal)")
    ax.set_ylabel("fraction")


def _phase_panel(ax: Any, x: list[int], steps: Sequence[Any]) -> None:
    bottom = [0.0] * len(x)
    for (label, name), color in zip(PHASES, PHASE_COLORS, strict=True):
        seconds = [v or 0.0 for v in step_values(steps, name)]
        ax.bar(x, seconds, bottom=bottom, color=color, label=label.removesuffix(" s"))
        bottom = [b + s for b, s in zip(bottom, seconds, strict=True)]
    ax.set_title("step phases")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)


def _nan_for_none(values: list[float | None]) -> list[float]:
    """matplotlib leaves a gap at NaN: a step without the value."""
    return [float("nan") if v is None else v for v in values]
