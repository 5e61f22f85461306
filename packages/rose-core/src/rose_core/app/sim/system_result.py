"""The figures reported per system, and the table / JSON of a scenario."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rose_core.app.sim.run_record import RunRecord
from rose_core.app.sim.serving_stats import ServingStats
from rose_core.app.sim.sim_environment import SimEnvironment
from rose_core.app.sim.system_profile import PROFILES


@dataclass(slots=True)
class SystemResult:
    system: str
    algorithm: str
    steps: int
    throughput_samples_per_s: float
    rollout_seconds_per_step: float
    allocation_overhead_ratio: float
    serving_ttft_p99_ms: float
    serving_tpot_p99_ms: float
    slo_violation_ratio: float
    rollout_share_of_step: float
    p75_done_fraction: float
    memory_cuts: int
    revocations: int
    turns_routed: dict[str, int]
    remote_sync_seconds_per_step: float = 0.0
    """Cross-cluster link time per weight version sent to the elastic GPUs (0 without them)."""
    per_step_rollout_s: list[float] = field(default_factory=list)
    per_step_ttft_p99_ms: list[float] = field(default_factory=list)
    per_step_tpot_p99_ms: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(env: SimEnvironment, record: RunRecord, borrowed: list[tuple[int, float]]) -> SystemResult:
    """``borrowed``: the serving GPUs rose borrows (the same GPUs' latency is reported for every system)."""
    stats = ServingStats(env, co_serving=PROFILES[record.system].elastic == "borrowed")
    trained = [record.batches[b] for b in sorted(record.batches) if record.batches[b].trained_at >= 0]
    windows = [(b.launched_at, b.rollout_end) for b in trained]
    per_step = [stats.latency(stats.histogram(borrowed, [w])) for w in windows]
    total = stats.latency(stats.histogram(borrowed, windows))
    slots = env.scenario.cluster.borrowable_gpus // env.scenario.rollout_model.tp
    elastic = PROFILES[record.system].elastic != "none"
    rollout = [b.rollout_s for b in trained]
    end = max(record.end_time, 1e-9)
    return SystemResult(
        record.system, record.algorithm, record.steps,
        round(record.steps * record.batch_size / end, 4),
        round(sum(rollout) / max(1, len(rollout)), 2),
        round(record.overhead_s / (slots * end), 5) if elastic and slots else 0.0,
        round(total.ttft_p99_ms, 2), round(total.tpot_p99_ms, 2), round(total.violation_ratio, 6),
        round(sum(rollout) / end, 4),
        round(sum(b.p75_fraction() for b in trained) / max(1, len(trained)), 3),
        record.memory_cuts, record.revocations,
        {k.removeprefix("routed_"): v for k, v in sorted(record.counters.items()) if k.startswith(("routed_", "rerouted_", "aborted_"))},
        round(record.remote_sync_s / max(1, record.steps), 3),
        [round(r, 2) for r in rollout],
        [round(s.ttft_p99_ms, 2) for s in per_step], [round(s.tpot_p99_ms, 2) for s in per_step])


def ratios(results: dict[str, SystemResult]) -> dict[str, dict[str, float]]:
    rose = results["rose"]
    out = {}
    for name, other in results.items():
        if name == "rose":
            continue
        out[name] = {
            "throughput": round(rose.throughput_samples_per_s / other.throughput_samples_per_s, 3),
            "rollout_speedup": round(other.rollout_seconds_per_step / rose.rollout_seconds_per_step, 3),
        }
    return out


COLUMNS = ("system", "samples/s", "rollout s/step", "alloc ovh", "TTFT p99 ms", "TPOT p99 ms", "SLO viol",
           "P75 done", "rose x")


def format_table(title: str, results: dict[str, SystemResult]) -> str:
    rat = ratios(results)
    rows = [COLUMNS]
    for name, r in results.items():
        rows.append((name, f"{r.throughput_samples_per_s:.3f}", f"{r.rollout_seconds_per_step:.1f}",
                     f"{100 * r.allocation_overhead_ratio:.2f}%", f"{r.serving_ttft_p99_ms:.0f}",
                     f"{r.serving_tpot_p99_ms:.0f}", f"{100 * r.slo_violation_ratio:.2f}%",
                     f"{r.p75_done_fraction:.2f}", f"{rat[name]['throughput']:.2f}" if name in rat else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [title] + ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def critical_path_line(bound: dict[str, float]) -> str:
    """One line under a table: the critical-path bound and the share of the possible gain each system took."""
    line = f"critical path (a GPU slot for every trajectory): {bound['rollout_seconds_per_step']:.1f} s/step"
    captured = [f"{k.removesuffix('_gain_captured')} {100 * v:.0f}%" for k, v in bound.items() if k.endswith("_captured")]
    return line + ("; share of fixed's gap to it closed: " + ", ".join(captured) if captured else "")
