"""Run every system of a scenario, for each of its algorithms, on one shared environment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rose_core.sim.cluster_sim import ClusterSim
from rose_core.sim.scenario import Scenario
from rose_core.sim.sim_environment import SimEnvironment
from rose_core.sim.system_profile import PROFILES
from rose_core.sim.system_result import SystemResult, ratios, summarize

Progress = Callable[[str, int], None]
"""Called with a label and the steps done so far."""


def run_scenario(scenario: Scenario, progress: Progress | None = None) -> dict[str, dict[str, SystemResult]]:
    """``{algorithm: {system: result}}``."""
    env = SimEnvironment(scenario)
    out: dict[str, dict[str, SystemResult]] = {}
    for algorithm in scenario.workload.algorithms:
        records = {}
        for name in scenario.systems:
            label = f"{algorithm}/{name}"
            tick = (lambda steps, label=label: progress(label, steps)) if progress else None
            records[name] = ClusterSim(env, PROFILES[name], algorithm, tick).run()
        borrowed = records["rose"].borrowed
        out[algorithm] = {name: summarize(env, rec, borrowed) for name, rec in records.items()}
    return out


def to_json(scenario: Scenario, results: dict[str, dict[str, SystemResult]]) -> dict[str, Any]:
    return {
        "scenario": scenario.name,
        "steps": scenario.workload.steps,
        "workloads": {
            alg: {"systems": {n: r.to_dict() for n, r in res.items()}, "ratios": ratios(res)}
            for alg, res in results.items()
        },
    }
