"""Everything a scenario's runs share: traffic, the co-serving table, serving GPU classes and their curves."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rose_core.app.sim.co_serving_table import CoServingTable
from rose_core.app.sim.harvest_curve import HarvestCurve
from rose_core.app.sim.scenario import Scenario
from rose_core.app.sim.traffic import Traffic, load_azure_trace, synthetic_traffic

CLASS_WEIGHTS = (0.5, 0.7, 0.9, 1.1, 1.3, 1.5)
"""Serving GPUs differ in load (a load balancer is never perfect): each candidate GPU carries one of these
multipliers of the fleet's per-GPU rate. Mean 1, so the fleet still averages ``mean_compute_use``."""


@dataclass(slots=True, frozen=True)
class ServingClass:
    weight: float
    multipliers: np.ndarray
    bins: np.ndarray
    curve: HarvestCurve
    serving_bytes: np.ndarray
    mean_bytes: float


@dataclass(slots=True, frozen=True)
class Candidate:
    worker_id: str
    serving_class: int
    offset: float


class SimEnvironment:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        sv = scenario.serving
        if sv.traffic == "azure-csv":
            self.traffic: Traffic = load_azure_trace(sv.trace_csv)
        else:
            self.traffic = synthetic_traffic(scenario.seed, sv.second_peak_to_mean, sv.minute_peak_to_mean,
                                             sv.prompt_tokens_mean, sv.output_tokens_mean)
        fleet = np.concatenate([self.traffic.per_second * w for w in CLASS_WEIGHTS])
        self.table = CoServingTable(scenario, fleet)
        self.classes = [self._serving_class(w) for w in CLASS_WEIGHTS]
        self.candidates = self._candidates()

    def _serving_class(self, weight: float) -> ServingClass:
        multipliers = self.traffic.per_second * weight
        bins = self.table.bins(multipliers)
        share = self.table.harvest[bins]
        serving_bytes = self.table.serving_bytes[bins]
        return ServingClass(weight, multipliers, bins, HarvestCurve(share), serving_bytes, float(serving_bytes.mean()))

    def _candidates(self) -> list[Candidate]:
        sc = self.scenario
        slots = sc.cluster.borrowable_gpus // sc.rollout_model.tp
        n = round(slots * sc.serving.candidates_per_borrowed)
        rng = np.random.default_rng(sc.seed + 1)
        period = len(self.traffic.per_second)
        return [Candidate(f"serving{i}", int(rng.integers(len(self.classes))), float(rng.integers(period)))
                for i in range(n)]

    def kv_usage_ratio(self, candidate: Candidate) -> float:
        device = self.scenario.gpu.memory_gib * (1 << 30)
        return self.classes[candidate.serving_class].mean_bytes / device
