"""What one RL step did, as `rose run` prints it, the run report stores it and the dashboard's history shows it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rose_core.app.controller.controller_stats import ControllerStats
from rose_core.app.controller.weight_sync import SyncBreakdown


@dataclass(slots=True)
class StepReport:
    step: int
    weight_version: int
    trajectories: int
    turns_dedicated: int
    turns_serving: int
    reward_mean: float
    rollout_seconds: float
    train_seconds: float
    sync_seconds: float
    sync_bytes: int
    serving_requests: int
    serving_ttft_p99_ms: float
    serving_tpot_p99_ms: float
    serving_slo_violations: int
    """Production requests over their serving host's SLO this step, judged by the host (vLLM's request timings,
    ``jobs.host_slo``), plus those that failed at the client; the p99s above are the client's."""
    serving_slo_judged: int = 0
    """Production requests the serving hosts judged this step (as of their last heartbeats)."""
    turns_rerouted: int = 0
    turns_overdue: int = 0
    """Of those, turns that ran over ``controller.turn_timeout_s`` on an executor that still heartbeats."""
    turns_held_moved: int = 0
    """Of those, turns a borrowed serving executor held back, moved to a dedicated one with room."""
    lost_trajectories: int = 0
    failed_trajectories: int = 0
    """Dropped because a turn of theirs failed on executors more often than ``scheduler.turn_retries`` allows."""
    version_mismatches: int = 0
    """Results that ran outside their turn's version window (refused by the controller, never trained on)."""
    refused_results: int = 0
    """Results the controller refused (``rose_core.app.controller.result_check``), every reason."""
    published_version: int = 0
    train_loss: float = 0.0
    sync_breakdown: SyncBreakdown = field(default_factory=SyncBreakdown)
    """Where ``sync_seconds`` went (``rose_core.app.controller.weight_sync``; ``docs/controller.md``)."""
    link_bytes: dict[str, int] = field(default_factory=dict)
    """Per cluster with a started relay: bytes of this step's version that crossed the link to it."""
    prefix_hit_ratio: dict[str, float] = field(default_factory=dict)
    """Per pool (dedicated, serving): this step's accepted turns' prompt tokens served from the prefix cache."""
    success_rate: float = 0.0
    """Trajectories whose environment reported success (FrozenLake: the goal reached) / trajectories rolled out."""
    eval_success: float | None = None
    """Greedy success on the held-out maps (``rl.eval.every``; None on steps that did not evaluate)."""
    train: dict[str, float | None] = field(default_factory=dict)
    """The trainer's statistics (``TrainStats``): loss, clip_fraction, ratio_mean, behaviour_ratio_mean,
    tis_truncated_fraction, approx_kl, kl_ref, grad_norm, tokens, samples."""
    dropped_groups: int = 0
    """Groups dropped by dynamic sampling (every reward equal: no gradient) and refilled."""
    groups: int = 0
    """Training groups rolled out: ``rl.prompts_per_step`` plus dynamic sampling's refills, so ``trajectories``
    is ``groups * rl.group_size`` when every one finished (each counted once)."""
    max_staleness: int = 0
    """The largest (trained version - sampling version) over the trained turns (<= scheduler.staleness)."""
    overlap_seconds: float = 0.0
    """Asynchronous steps: seconds of this step's training during which the next step's rollouts ran."""
    step_seconds: float = 0.0
    """Wall time from this step's start to its weights shipped (overlap included)."""
    checkpoint: str = ""
    """The checkpoint written after this step ("" when none)."""


TRAIN_FIGURES = ("loss", "clip_fraction", "ratio_mean", "behaviour_ratio_mean", "tis_truncated_fraction",
                 "approx_kl", "kl_ref", "grad_norm", "logprob_gap", "tokens", "samples")


def train_figures(stats: Any) -> dict[str, float | None]:
    """The report's view of ``TrainStats`` (empty when the step trained nothing)."""
    if stats is None:
        return {}
    out: dict[str, float | None] = {}
    for name in TRAIN_FIGURES:
        value = getattr(stats, name, None)
        out[name] = None if value is None else float(value)
    return out


def share(flags: Iterable[bool]) -> float:
    values = list(flags)
    return sum(values) / len(values) if values else 0.0


def prefix_hit_ratio(stats: ControllerStats, before: tuple[dict[str, int], dict[str, int]]) -> dict[str, float]:
    """Per pool: the prompt tokens of the turns accepted since ``before`` (prompt and prefix-hit tokens by pool)
    served from the prefix cache."""
    prompt0, hit0 = before
    out = {}
    for role, prompt in stats.prompt_tokens_by_role.items():
        tokens = prompt - prompt0.get(role, 0)
        hits = stats.prefix_hit_tokens_by_role.get(role, 0) - hit0.get(role, 0)
        out[role] = round(hits / tokens, 4) if tokens else 0.0
    return out
