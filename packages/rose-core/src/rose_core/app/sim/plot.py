"""`rose sim --plot FILE.png`: per-step rollout time and serving p99 latency of every system."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rose_core.app.sim.scenario import Scenario
from rose_core.app.sim.scenario_run import WorkloadResults
from rose_core.app.sim.system_profile import PROFILES
from rose_core.app.sim.system_result import SystemResult
from rose_core.support.errors import require_extra


def pyplot() -> Any:
    """matplotlib's pyplot on the file backend; ``rose sim --plot`` calls it before the (long) simulation so a
    missing extra fails first."""
    with require_extra("matplotlib (for --plot)", "'rose-core[sim]'"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    return plt


def plot_results(path: str | Path, scenario: Scenario, results: dict[str, WorkloadResults]) -> None:
    plt = pyplot()
    algorithms = list(results)
    fig, axes = plt.subplots(2, len(algorithms), figsize=(6 * len(algorithms), 8.5), squeeze=False)
    for col, alg in enumerate(algorithms):
        top, bottom = axes[0][col], axes[1][col]
        bound = results[alg].critical_path.per_step_rollout_s
        top.plot(range(1, len(bound) + 1), bound, color="0.6", linestyle=":", label="critical path")
        for name, r in results[alg].systems.items():
            top.plot(range(1, len(r.per_step_rollout_s) + 1), r.per_step_rollout_s, marker="o", label=name)
        top.set_title(f"{scenario.name} / {alg}: rollout time per step")
        top.set_xlabel("step")
        top.set_ylabel("seconds")
        top.legend(fontsize=8)
        _serving_panel(bottom, scenario, results[alg].systems)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _serving_panel(ax: Any, scenario: Scenario, systems: dict[str, SystemResult]) -> None:
    """Serving p99 on the GPUs rose borrows: alone (every system that leaves them alone has the same
    latency, so one line) and co-served by each system that borrows them, under the SLO budgets."""
    groups: dict[str, SystemResult] = {}
    for name, r in systems.items():
        key = name if PROFILES[name].elastic == "borrowed" else "serving alone"
        groups.setdefault(key, r)
    for (label, r), color in zip(groups.items(), ("tab:gray", "tab:purple", "tab:brown", "tab:olive"), strict=False):
        steps = range(1, len(r.per_step_ttft_p99_ms) + 1)
        ax.plot(steps, r.per_step_ttft_p99_ms, marker="o", color=color, label=f"{label} TTFT")
        ax.plot(steps, r.per_step_tpot_p99_ms, linestyle="--", color=color, label=f"{label} TPOT")
    sv = scenario.serving
    ax.axhline(sv.ttft_slo_ms, color="tab:red", linewidth=1, label=f"TTFT SLO {sv.ttft_slo_ms:.0f} ms")
    ax.axhline(sv.tpot_slo_ms, color="tab:red", linewidth=1, linestyle="--", label=f"TPOT SLO {sv.tpot_slo_ms:.0f} ms")
    ax.set_yscale("log")
    ax.set_title("serving p99 on the borrowed GPUs (rollout phases)")
    ax.set_xlabel("step")
    ax.set_ylabel("ms (log)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
