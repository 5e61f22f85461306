"""`rose sim --plot FILE.png`: per-step rollout time and serving p99 latency of every system."""

from __future__ import annotations

from pathlib import Path

from rose_core.errors import MissingExtraError
from rose_core.sim.scenario_run import WorkloadResults


def plot_results(path: str | Path, scenario: str, results: dict[str, WorkloadResults]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtraError("matplotlib (for --plot)", "'rose-core[sim]'") from exc
    algorithms = list(results)
    fig, axes = plt.subplots(2, len(algorithms), figsize=(6 * len(algorithms), 7), squeeze=False)
    for col, alg in enumerate(algorithms):
        top, bottom = axes[0][col], axes[1][col]
        bound = results[alg].critical_path.per_step_rollout_s
        top.plot(range(1, len(bound) + 1), bound, color="0.6", linestyle=":", label="critical path")
        for name, r in results[alg].systems.items():
            steps = range(1, len(r.per_step_rollout_s) + 1)
            top.plot(steps, r.per_step_rollout_s, marker="o", label=name)
            bottom.plot(steps, r.per_step_ttft_p99_ms, marker="o", label=f"{name} TTFT")
            bottom.plot(steps, r.per_step_tpot_p99_ms, linestyle="--", label=f"{name} TPOT")
        top.set_title(f"{scenario} / {alg}: rollout time per step")
        top.set_xlabel("step")
        top.set_ylabel("seconds")
        top.legend(fontsize=8)
        bottom.set_title("serving p99 on the borrowed GPUs (rollout phases)")
        bottom.set_xlabel("step")
        bottom.set_ylabel("ms")
        bottom.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
