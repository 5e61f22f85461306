"""What a borrowed serving GPU gives the rollout at each serving load level, decided by the REAL
``DualSlackAdmission`` (the executor's policy object), and the serving latency it leaves.

For a load level (requests/s on this GPU) the serving engine's steady state is solved from Little's law
(decode batch = rate * output tokens * TPOT). The admission controller is then asked, at a moment when every
decoding request has just emitted a token and a p99-long prompt arrived one step ago, which of a full
rollout step (``concurrency`` decodes + one 512-token prefill chunk) it admits. The GPU's time is shared
step by step: the rollout share is ``rollout step / (serving step + rollout step)`` while serving is busy and
1 while it is idle. The policy is pure, so one call per load level (memoised) is the same decision the
executor would take at every step of that load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rose_core.policy import AdmissionConfig, DualSlackAdmission, RolloutWork, ServingRequest
from rose_core.sim.gpu_model import RooflineModel
from rose_core.sim.scenario import Scenario

BINS = 128
MAX_SEQS = 256
P99_PROMPT_FACTOR = 3.0
"""p99 / mean prompt length: a lognormal prompt-length spread of sigma ~0.75 (assumption, see docs)."""


@dataclass(slots=True, frozen=True)
class LoadLevel:
    rate: float
    harvest: float
    ttft_alone_s: float
    tpot_alone_s: float
    ttft_rose_s: float
    tpot_rose_s: float
    serving_bytes: float


class CoServingTable:
    def __init__(self, scenario: Scenario, max_multiplier: float) -> None:
        sv = scenario.serving
        self.serving = RooflineModel(scenario.gpu, sv.model)
        self.rollout = RooflineModel(scenario.gpu, scenario.rollout_model)
        self.admission = DualSlackAdmission(
            AdmissionConfig(sv.ttft_slo_ms / 1000, sv.tpot_slo_ms / 1000, margin_s=0.005),
            self.serving.profile(), self.rollout.profile())
        self.scenario = scenario
        tokens = sv.prompt_tokens_mean + sv.output_tokens_mean
        peak = scenario.gpu.peak_tflops * 1e12 * sv.model.tp
        self.mean_rate = sv.mean_compute_use * peak / (2 * sv.model.params_b * 1e9 * tokens)
        """Requests/s per GPU (per serving TP group) that use ``mean_compute_use`` of peak FLOPs."""
        self.edges = np.linspace(0.0, max_multiplier * 1.0001, BINS + 1)
        centers = (self.edges[:-1] + self.edges[1:]) / 2
        self.levels = [self._level(float(m) * self.mean_rate) for m in centers]
        self.harvest = np.array([lv.harvest for lv in self.levels])
        self.serving_bytes = np.array([lv.serving_bytes for lv in self.levels])

    def bins(self, multipliers: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.clip(np.digitize(multipliers, self.edges) - 1, 0, BINS - 1)
        return out

    def _level(self, rate: float) -> LoadLevel:
        sv = self.scenario.serving
        ctx = sv.prompt_tokens_mean + sv.output_tokens_mean / 2
        batch, step = 0.0, self.serving.step_s(1, 0, ctx)
        for _ in range(30):  # capped like an engine: max_num_seqs 256, one prefill chunk per step
            batch = min(MAX_SEQS, rate * sv.output_tokens_mean * step)
            step = self.serving.step_s(max(batch, 1.0), min(sv.chunk_tokens, rate * sv.prompt_tokens_mean * step), ctx)
        busy = min(1.0, batch)
        x = self._admitted_rollout_s(max(1, round(batch)), step)
        p99_prompt = sv.prompt_tokens_mean * P99_PROMPT_FACTOR
        prefill = self.serving.prefill_s(p99_prompt, sv.chunk_tokens)
        chunks = -(-p99_prompt // sv.chunk_tokens)
        kv = batch * ctx * sv.model.kv_bytes_per_token / sv.model.tp
        return LoadLevel(rate, (1 - busy) + busy * x / (step + x), step + prefill, step,
                         step + x + prefill + chunks * x, step + x, self.serving.weight_bytes + kv)

    def _admitted_rollout_s(self, decoding: int, step: float) -> float:
        sv = self.scenario.serving
        now = 1000.0
        serving = [ServingRequest(f"d{i}", now - 1.0, last_token_at=now) for i in range(decoding)]
        serving.append(ServingRequest("p", now - step, remaining_prompt_tokens=int(sv.prompt_tokens_mean * 3)))
        n = self.scenario.workload.concurrency_per_worker
        candidates = [RolloutWork(f"r{i}", "decode") for i in range(n)] + [RolloutWork("pf", "prefill", 4096)]
        d = self.admission.admit(now, serving, candidates)
        return self.rollout.step_s(d.decode_seqs, d.prefill_tokens, 2048.0)
