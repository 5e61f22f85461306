"""What a borrowed serving GPU gives the rollout at each serving load level, decided by the REAL co-serving
guard (``CoServingGuard``, built as the executor builds it), and the serving latency it leaves.

For a load level (requests/s on this GPU) the serving engine's steady state is solved from Little's law
(decode batch = rate * output tokens * TPOT) and its busy-time fraction from the number of requests in
flight (Poisson, M/G/inf: busy = 1 - exp(-rate * request time)). The guard is then asked (``decide``), at a
moment when every decoding request has just emitted a token and a p99-long prompt arrived one step ago, what
a rollout engine running ``concurrency`` sequences with one more turn queued may do: run (every running
sequence decodes) or be held, and how many tokens of the queued turn's prefill (at most one 512-token chunk)
it admits. The guard's settings are the executor's defaults: SLO budgets from the scenario, a 512-token chunk,
``serving.admission_margin_ms`` (0 by default) plus the hold margin (the rollout step at ``concurrency``
with a prefill chunk: a hold cannot stop the step in flight). The GPU's time is
shared step by step: the rollout share is ``rollout step / (serving step + rollout step)`` while serving is
busy and 1 while it is idle. The policy is pure, so one call per load level (memoised) is the same decision
the executor would take at every step of that load.

Calibration: the paper reads the Azure trace as 18.9% average SM utilisation and 14.3% average HBM
utilisation. SM utilisation (DCGM ``SM_ACTIVE``) is the share of time the SMs run work, memory-bound decode
included, so the fleet's per-GPU rate is bisected until the *busy-time* fraction, averaged over the fleet's
load distribution, equals ``mean_compute_use``. ``hbm_use`` (bytes moved per second / HBM bandwidth, same
average) is then a check of that reading against the paper's second figure, not an input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rose_core.app.sim.gpu_model import RooflineModel
from rose_core.app.sim.scenario import Scenario
from rose_core.policy import CoServingGuard, GuardSettings, LiveRequest, QueuedTurn, SloBudgets

BINS = 128
MAX_SEQS = 256
P99_PROMPT_FACTOR = 3.0
"""p99 / mean prompt length: a lognormal prompt-length spread of sigma ~0.75 (assumption, see docs)."""
ROLLOUT_CHUNK_TOKENS = 512
"""Rollout prefill tokens per engine step: the guard's chunk and the turn cost's (paper-notes 2.1(c))."""
QUEUED_PROMPT_TOKENS = 4096
"""The queued rollout turn's prompt: longer than a chunk, so the guard decides how much of one it admits."""


@dataclass(slots=True, frozen=True)
class SteadyState:
    """The serving engine alone at one request rate."""

    batch: float
    """Decode sequences per step while busy."""
    step_s: float
    busy: float
    """Fraction of time the engine has a request in flight."""
    hbm_use: float
    """Bytes moved per second / HBM bandwidth, averaged over busy and idle time."""


@dataclass(slots=True, frozen=True)
class LoadLevel:
    rate: float
    harvest: float
    busy: float
    hbm_use: float
    ttft_alone_s: float
    tpot_alone_s: float
    ttft_rose_s: float
    tpot_rose_s: float
    serving_bytes: float


class CoServingTable:
    def __init__(self, scenario: Scenario, load_multipliers: np.ndarray) -> None:
        """``load_multipliers``: the per-second load of every serving GPU as a multiple of the fleet's mean
        per-GPU rate (mean about 1); the table's bins span it, and the calibration averages over it."""
        sv = scenario.serving
        self.scenario = scenario
        self.serving = RooflineModel(scenario.gpu, sv.model)
        self.rollout = RooflineModel(scenario.gpu, scenario.rollout_model)
        settings = GuardSettings(SloBudgets(sv.ttft_slo_ms / 1000, sv.tpot_slo_ms / 1000), ROLLOUT_CHUNK_TOKENS,
                                 sv.admission_margin_ms / 1000, hold_margin=True,
                                 rollout_batch=scenario.workload.concurrency_per_worker)
        self.guard = CoServingGuard.build(settings, self.serving.profile(), self.rollout.profile())
        top = float(np.max(load_multipliers))
        self.edges = np.linspace(0.0, top * 1.0001, BINS + 1)
        self.centers = (self.edges[:-1] + self.edges[1:]) / 2
        self.weights = np.bincount(self.bins(np.asarray(load_multipliers)), minlength=BINS) / len(load_multipliers)
        self.mean_rate = self._calibrated_rate(sv.mean_compute_use)
        """Requests/s per GPU (per serving TP group) whose fleet-average busy time is ``mean_compute_use``."""
        self.levels = [self._level(float(m) * self.mean_rate) for m in self.centers]
        self.harvest = np.array([lv.harvest for lv in self.levels])
        self.serving_bytes = np.array([lv.serving_bytes for lv in self.levels])

    def bins(self, multipliers: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.clip(np.digitize(multipliers, self.edges) - 1, 0, BINS - 1)
        return out

    def fleet_mean(self, field: str) -> float:
        """A ``LoadLevel`` field averaged over the fleet's load distribution."""
        return float(sum(w * getattr(lv, field) for w, lv in zip(self.weights, self.levels, strict=True)))

    def _calibrated_rate(self, target_busy: float) -> float:
        def fleet_busy(rate: float) -> float:
            return float(sum(w * self.steady(m * rate).busy for w, m in zip(self.weights, self.centers, strict=True) if w))

        lo, hi = 0.0, 1.0
        while fleet_busy(hi) < target_busy and hi < 1e6:
            lo, hi = hi, hi * 4
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if fleet_busy(mid) < target_busy else (lo, mid)
        return (lo + hi) / 2

    def steady(self, rate: float) -> SteadyState:
        """The serving engine's steady state at ``rate`` requests/s, capped like an engine: max_num_seqs 256,
        one prefill chunk per step."""
        sv = self.scenario.serving
        ctx = sv.prompt_tokens_mean + sv.output_tokens_mean / 2
        busy, batch, chunk, step = 0.0, 1.0, 0.0, self.serving.step_s(1, 0, ctx)
        for _ in range(20):
            in_flight = rate * (sv.output_tokens_mean * step + self.serving.prefill_s(sv.prompt_tokens_mean,
                                                                                     sv.chunk_tokens))
            busy = 1 - math.exp(-in_flight)
            batch = min(MAX_SEQS, max(1.0, rate * sv.output_tokens_mean * step / max(busy, 1e-9)))
            chunk = min(sv.chunk_tokens, rate * sv.prompt_tokens_mean * step / max(busy, 1e-9))
            step = self.serving.step_s(batch, chunk, ctx)
        moved = self.serving.weight_bytes + batch * ctx * sv.model.kv_bytes_per_token / sv.model.tp
        bandwidth = self.scenario.gpu.hbm_tb_s * 1e12
        return SteadyState(batch, step, busy, busy * moved / step / bandwidth)

    def _level(self, rate: float) -> LoadLevel:
        sv = self.scenario.serving
        st = self.steady(rate)
        x = self._admitted_rollout_s(max(1, round(st.batch)), st.step_s)
        p99_prompt = sv.prompt_tokens_mean * P99_PROMPT_FACTOR
        prefill = self.serving.prefill_s(p99_prompt, sv.chunk_tokens)
        chunks = -(-p99_prompt // sv.chunk_tokens)
        ctx = sv.prompt_tokens_mean + sv.output_tokens_mean / 2
        kv = rate * sv.output_tokens_mean * st.step_s * ctx * sv.model.kv_bytes_per_token / sv.model.tp
        harvest = (1 - st.busy) + st.busy * x / (st.step_s + x)
        return LoadLevel(rate, harvest, st.busy, st.hbm_use, st.step_s + prefill, st.step_s,
                         st.step_s + x + prefill + chunks * x, st.step_s + x, self.serving.weight_bytes + kv)

    def _admitted_rollout_s(self, decoding: int, step: float) -> float:
        """The rollout step the guard lets run beside this load: every running sequence's decode (or none,
        when it holds the engine) plus the admitted prefill tokens of the queued turn."""
        sv, wl = self.scenario.serving, self.scenario.workload
        now = 1000.0
        out = round(sv.output_tokens_mean)
        prompt = round(sv.prompt_tokens_mean)
        serving = [LiveRequest(f"d{i}", now - 1.0, prompt, out, 1, False, now) for i in range(decoding)]
        serving.append(LiveRequest("p", now - step, int(sv.prompt_tokens_mean * P99_PROMPT_FACTOR), out, 0, True, None))
        running = [f"r{i}" for i in range(wl.concurrency_per_worker)]
        verdict = self.guard.decide(now, serving, running, [QueuedTurn("pf", QUEUED_PROMPT_TOKENS)])
        if not verdict.run_rollout:
            return 0.0
        return self.rollout.step_s(verdict.decode_seqs, verdict.prefill_tokens, 2048.0)
