"""Run every system of a scenario, for each of its algorithms, on one shared environment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rose_core.app.sim.cluster_sim import ClusterSim
from rose_core.app.sim.scenario import Scenario
from rose_core.app.sim.sim_environment import SimEnvironment
from rose_core.app.sim.system_profile import PROFILES
from rose_core.app.sim.system_result import SystemResult, ratios, summarize

Progress = Callable[[str, int], None]
"""Called with a label and the steps done so far."""


@dataclass(slots=True)
class WorkloadResults:
    """Every system on one algorithm's workload, and the critical-path reference."""

    systems: dict[str, SystemResult]
    critical_path: SystemResult
    """``fixed`` with a dedicated GPU per trajectory in flight, one sequence each: the fastest any amount of
    GPUs can roll a step out, bound by each step's longest trajectory."""


def run_scenario(scenario: Scenario, progress: Progress | None = None) -> dict[str, WorkloadResults]:
    """``{algorithm: results}``."""
    env = SimEnvironment(scenario)
    out: dict[str, WorkloadResults] = {}
    for algorithm in scenario.workload.algorithms:
        records = {}
        for name in scenario.systems:
            label = f"{algorithm}/{name}"
            tick = (lambda steps, label=label: progress(label, steps)) if progress else None
            records[name] = ClusterSim(env, PROFILES[name], algorithm, tick).run()
        tick = (lambda steps, label=f"{algorithm}/critical path": progress(label, steps)) if progress else None
        bound = ClusterSim(env, PROFILES["fixed"], algorithm, tick, unbounded=True).run()
        borrowed = records["rose"].borrowed
        out[algorithm] = WorkloadResults({name: summarize(env, rec, borrowed) for name, rec in records.items()},
                                         summarize(env, bound, borrowed))
    return out


def to_json(scenario: Scenario, results: dict[str, WorkloadResults]) -> dict[str, Any]:
    return {
        "scenario": scenario.name,
        "steps": scenario.workload.steps,
        "workloads": {
            alg: {"systems": {n: r.to_dict() for n, r in res.systems.items()}, "ratios": ratios(res.systems),
                  "critical_path": critical_path(res)}
            for alg, res in results.items()
        },
    }


def critical_path(res: WorkloadResults) -> dict[str, float]:
    """How much of the rollout time that extra capacity can remove at all, and how much each system removed."""
    bound = res.critical_path.rollout_seconds_per_step
    out = {"rollout_seconds_per_step": bound}
    fixed = res.systems.get("fixed")
    if fixed is not None and fixed.rollout_seconds_per_step > bound:
        room = fixed.rollout_seconds_per_step - bound
        for name, r in res.systems.items():
            if name != "fixed" and not PROFILES[name].asynchronous:  # async rollout times include queueing
                out[f"{name}_gain_captured"] = round((fixed.rollout_seconds_per_step - r.rollout_seconds_per_step) / room, 3)
    return out
