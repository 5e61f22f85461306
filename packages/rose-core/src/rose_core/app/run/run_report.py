"""The JSON report of `rose run` and its per-step table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from rose_core.app.jobs.step_report import StepReport


@dataclass(slots=True)
class RunReport:
    steps: list[StepReport] = field(default_factory=list)
    lost_trajectories: int = 0
    failed_trajectories: int = 0
    """Dropped after a turn failed on executors more often than ``scheduler.turn_retries`` allows."""
    version_mismatches: int = 0
    refused_results: int = 0
    weight_digest_mismatches: int = 0
    """Engines that reported weights other than the trainer's, summed over steps (0: bit-exact)."""
    late_results: int = 0
    turns_rerouted: int = 0
    turns_overdue: int = 0
    """Turns re-routed after running over ``controller.turn_timeout_s`` (summed over steps)."""
    turns_held_moved: int = 0
    """Turns held back on a borrowed serving executor and moved to a dedicated one (summed over steps)."""
    serving_requests: int = 0
    serving_failed_requests: int = 0
    serving_ttft_p99_ms: float = 0.0
    """The load generator's p99 TTFT from the first step on (its clock: HTTP and its process included)."""
    serving_tpot_p99_ms: float = 0.0
    serving_slo_violations: int = 0
    """Production requests over their serving host's SLO, judged by the host (``jobs.host_slo``), plus those
    that failed at the client."""
    serving_slo_judged: int = 0
    """Production requests the serving hosts judged (those finished once their SLO was known)."""
    client_slo_violations: int = 0
    """The load generator's requests over their host's SLO by its own clock (HTTP and its process included: in
    `rose run` it shares a process and cores with the trainer), for comparison; requests that arrived from the
    first step on."""
    slo_ttft_ms: float = 0.0
    """The first serving host's SLO (``serving_slo`` has every host's); the job's `[slo]` when none reported."""
    slo_tpot_ms: float = 0.0
    serving_slo: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per serving host: its SLO (``ttft_ms``, ``tpot_ms``) and how it was set (``basis``)."""
    executors: list[dict[str, Any]] = field(default_factory=list)
    borrowing: list[dict[str, Any]] = field(default_factory=list)
    """Serving executors borrowed (with every candidate's KV use) and revoked, in order (``Controller.borrowing``)."""
    error: str = ""
    stopped_after_step: int = 0
    """The step after which SIGUSR1 stopped the run, short of ``rl.steps`` (``interrupts.StopRequest``); 0: not stopped.
    A stopped run is a completed one: ``ok`` judges the steps it ran."""
    retired_executors: dict[str, str] = field(default_factory=dict)
    """Executors taken out of the job while it went on (a failed weight apply, an exited process), and why."""
    left_executors: dict[str, str] = field(default_factory=dict)
    """Executors that ended their lease before the job did (revoked by their operator, their rollout engine
    died, ...), and why (``ControllerStats.left``)."""

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and bool(self.steps)
            and self.lost_trajectories == 0
            and self.version_mismatches == 0
            and self.weight_digest_mismatches == 0
            and all(s.trajectories > 0 for s in self.steps)
        )

    def add(self, step: StepReport) -> None:
        self.steps.append(step)
        self.lost_trajectories += step.lost_trajectories
        self.failed_trajectories += step.failed_trajectories
        self.version_mismatches += step.version_mismatches
        self.refused_results += step.refused_results
        self.weight_digest_mismatches += step.sync_breakdown.digest_mismatches
        self.turns_rerouted += step.turns_rerouted
        self.turns_overdue += step.turns_overdue
        self.turns_held_moved += step.turns_held_moved

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__slots__}
        data["steps"] = [asdict(s) for s in self.steps]
        data["ok"] = self.ok
        return data


COLUMNS = [
    ("step", "step", "{}"),
    ("ver", "weight_version", "{}"),
    ("traj", "trajectories", "{}"),
    ("turns ded/srv", None, ""),
    ("reward", "reward_mean", "{:+.3f}"),
    ("rollout s", "rollout_seconds", "{:.1f}"),
    ("train s", "train_seconds", "{:.2f}"),
    ("sync s", "sync_seconds", "{:.2f}"),
    ("sync MB", None, ""),
    ("srv req", "serving_requests", "{}"),
    ("client TTFT p99 ms", "serving_ttft_p99_ms", "{:.0f}"),
    ("client TPOT p99 ms", "serving_tpot_p99_ms", "{:.0f}"),
    ("SLO viol", "serving_slo_violations", "{}"),
]


def step_row(s: StepReport) -> list[str]:
    cells = []
    for title, attr, fmt in COLUMNS:
        if title == "turns ded/srv":
            cells.append(f"{s.turns_dedicated}/{s.turns_serving}")
        elif title == "sync MB":
            cells.append(f"{s.sync_bytes / 1e6:.1f}")
        else:
            cells.append(fmt.format(getattr(s, attr or "")))
    return cells


def format_table(steps: list[StepReport]) -> str:
    header = [title for title, _, _ in COLUMNS]
    rows = [header, *(step_row(s) for s in steps)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def sync_summary(steps: list[StepReport]) -> str:
    """One line: the median weight sync and the median of each of its parts (``sync_breakdown``)."""
    if not steps:
        return ""
    parts = [(name, median(getattr(s.sync_breakdown, f"{name}_s") for s in steps))
             for name in ("publish", "transfer", "apply", "wait")]
    return (f"weight sync median {median(s.sync_seconds for s in steps):.2f} s: "
            + " · ".join(f"{name} {value:.2f}" for name, value in parts) + " (transfer/apply/wait: max over executors)")
