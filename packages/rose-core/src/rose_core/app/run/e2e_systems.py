"""The systems `rose bench e2e` compares, each the same RL job (same seed, same steps) as a `rose run` config,
and what one run of each yields (pure: report and step times in, figures out).

- ``fixed``: no borrowing (``scheduler.max_borrowed_workers = 0``): the dedicated pool alone, synchronous.
- ``fixed-async``: the same, one step of staleness (``scheduler.staleness = 1``).
- ``rose``: borrowing with the guard (the defaults).
- ``colocated``: borrowing with the guard off on the serving hosts (``[slo] guard = false``) and the rollout
  engine at production's CPU priority (``[rollout] nice = 0``): the naive co-location of the paper's Table 1.

Every system keeps the serving hosts on their own cores (``[executors] serving_cores``) and judges production
by the one SLO measured for the invocation (``[slo] ttft_ms`` / ``tpot_ms``, ``from_alone = 0``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from statistics import median
from typing import Any

import msgspec

from rose_core.app.config import RunConfig
from rose_core.app.jobs.host_slo import HostSlo
from rose_core.app.run.run_report import RunReport

SYSTEMS = ("fixed", "fixed-async", "rose", "colocated")

WORKLOAD: dict[str, Any] = {
    "rl": {"prompts_per_step": 6, "group_size": 4, "max_turns": 6, "max_tokens_per_turn": 48, "eval": {"every": 0},
           "trainer": {"epochs": 1}},
}
"""The bench's job, over the demo's: more and longer multi-turn rollouts per step and one pass over each batch
(verl's default ``ppo_epochs``; the demo makes two), so that rollout is most of a fixed step as in the paper
(its share is reported: ``rollout_share``); no evaluation turns."""


def base_config(overrides: dict[str, Any] | None = None) -> RunConfig:
    """The demo's defaults with ``WORKLOAD`` over them (or ``overrides``: a whole config's layout)."""
    return msgspec.convert(overrides if overrides is not None else WORKLOAD, RunConfig)


def system_config(base: RunConfig, system: str, slo: HostSlo, steps: int, run_dir: str) -> RunConfig:
    """``base`` as ``system`` runs it: ``steps`` steps in ``run_dir``, judged (and guarded) by ``slo``."""
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}: one of {', '.join(SYSTEMS)}")
    config = msgspec.convert(msgspec.to_builtins(base), RunConfig)
    config.rl.steps, config.run_dir = steps, run_dir
    config.slo.from_alone, config.slo.ttft_ms, config.slo.tpot_ms = 0.0, slo.ttft_ms, slo.tpot_ms
    config.scheduler.staleness = 1 if system == "fixed-async" else 0
    if system in ("fixed", "fixed-async"):
        config.scheduler.max_borrowed_workers = 0
    if system == "colocated":
        overrides = dict(config.executors.serving_overrides)
        overrides["slo"] = {**dict(overrides.get("slo", {})), "guard": False}
        overrides["rollout"] = {**dict(overrides.get("rollout", {})), "nice": 0}  # production's CPU priority
        config.executors.serving_overrides = overrides
    return msgspec.convert(msgspec.to_builtins(config), RunConfig)  # checked as a file would be


def figures(report: RunReport, step_ends: Sequence[float]) -> dict[str, Any]:
    """One system's figures. Throughput and step times leave out the first step (engines and caches warm up
    in it): ``samples_per_s`` is the trajectories of steps 2..N over the time from the end of step 1 to the
    end of step N. ``rollout_s_per_step`` is the step's report of its rollout: with staleness (``fixed-async``)
    only the wait for it that training did not hide."""
    steps = report.steps
    warm = steps[1:] if len(steps) > 1 else steps
    span = step_ends[-1] - step_ends[0] if len(step_ends) > 1 else 0.0
    wall = [b - a for a, b in itertools.pairwise(step_ends)]
    rollout = [s.rollout_seconds for s in warm]
    judged = report.serving_slo_judged
    return {
        "ok": report.ok,
        "error": report.error,
        "steps": len(steps),
        "samples_per_s": sum(s.trajectories for s in warm) / span if span > 0 else 0.0,
        "step_s": median(wall) if wall else 0.0,
        "rollout_s_per_step": median(rollout) if rollout else 0.0,
        "rollout_share": median(r / w for r, w in zip(rollout, wall, strict=False) if w > 0) if wall else 0.0,
        "slo_attainment": 1 - report.serving_slo_violations / judged if judged else 1.0,
        "slo_judged": judged,
        "slo_violations": report.serving_slo_violations,
        "client_slo_violations": report.client_slo_violations,
        "ttft_p99_ms": report.serving_ttft_p99_ms,
        "tpot_p99_ms": report.serving_tpot_p99_ms,
        "turns_serving": sum(s.turns_serving for s in steps),
        "turns_dedicated": sum(s.turns_dedicated for s in steps),
        "reward_last5": sum(s.reward_mean for s in steps[-5:]) / len(steps[-5:]) if steps else 0.0,
        "reward": [round(s.reward_mean, 4) for s in steps],
    }


def ratios(systems: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``rose / fixed`` and ``rose / fixed-async`` samples/s, where both ran."""
    out = {}
    rose = systems.get("rose", {}).get("samples_per_s", 0.0)
    for base in ("fixed", "fixed-async"):
        other = systems.get(base, {}).get("samples_per_s", 0.0)
        if rose and other:
            out[f"rose/{base}"] = rose / other
    return out
