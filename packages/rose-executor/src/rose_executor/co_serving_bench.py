"""``rose-executor bench``: serving alone / co-located unguarded / co-located guarded, at three bursty loads.

Both engines run in this process (their cores in child processes) with the tiny models of the embedded
default. Serving latency comes from vLLM's stat logger (per finished request: TTFT and mean TPOT; per token:
inter-token latency). The rollout side is the real ``RolloutRunner``: saturated with long turns, started at
once (unguarded) or by the real ``CoServing`` control tick (guarded, dual-slack admission only: the p99
feedback rule is off so the figures show the per-tick policy alone).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rose_core.messages import SamplingParams, TurnAborted, TurnRequest, TurnResult
from rose_core.policy import AdmissionConfig, DualSlackAdmission
from rose_executor.co_serving import CoServing
from rose_executor.co_serving_guard import CoServingGuard
from rose_executor.latency_profile import EngineProfile, load_or_profile
from rose_executor.rollout_runner import RolloutRunner

LEVELS = {"low": 0.2, "medium": 0.5, "high": 0.8}
SERVING_PROMPT, SERVING_TOKENS = 32, 32
ROLLOUT_PROMPT, ROLLOUT_TOKENS, ROLLOUT_CONCURRENCY = 64, 128, 8
SLO_MULTIPLE = 3.0


@dataclass(slots=True)
class StatsCollector:
    """The serving engine's stat-logger observer for one measurement window."""

    finished: list[tuple[float, float]] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)

    def on_iteration(
        self, ttfts: Sequence[float], tpots: Sequence[float], finished: Sequence[tuple[float, float]]
    ) -> None:
        self.itls.extend(tpots)
        self.finished.extend(finished)

    def on_scheduler(self, kv_usage_ratio: float) -> None:
        return None


class RolloutLoad:
    """Keeps ``ROLLOUT_CONCURRENCY`` long rollout turns submitted through a real ``RolloutRunner``."""

    def __init__(self, engine: Any, guarded: bool) -> None:
        self.tokens = 0
        self._n = 0
        self._stopped = False
        self.runner = RolloutRunner(engine, "bench", ROLLOUT_CONCURRENCY, self._on_reply, guarded=guarded)

    def start(self) -> None:
        for _ in range(ROLLOUT_CONCURRENCY):
            self._submit()

    def _submit(self) -> None:
        self._n += 1
        prompt = (np.arange(ROLLOUT_PROMPT, dtype=np.int32) * 7 + self._n) % 150 + 3
        self.runner.submit(
            TurnRequest(
                turn_id=f"r{self._n}",
                trajectory_id=f"t{self._n}",
                attempt=0,
                prompt_token_ids=prompt,
                sampling=SamplingParams(max_tokens=ROLLOUT_TOKENS, temperature=1.0, logprobs=False),
                min_version=0,
                max_version=0,
            )
        )

    def _on_reply(self, msg: Any) -> None:
        if isinstance(msg, TurnResult):
            self.tokens += len(msg.output_token_ids)
        if isinstance(msg, (TurnResult, TurnAborted)) and not self._stopped:
            asyncio.get_running_loop().call_soon(self._submit)

    async def stop(self) -> None:
        self._stopped = True
        await self.runner.abort_all("shutdown")


async def serving_traffic(engine: Any, rps: float, seconds: float, seed: int) -> int:
    """Bursty open-loop traffic: bursts of 1-4 requests, burst gaps exponential at ``rps`` on average."""
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=SERVING_TOKENS, temperature=0.0, logprobs=False)
    tasks: list[asyncio.Task[Any]] = []
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        burst = rng.randint(1, 4)
        for _ in range(burst):
            n += 1
            prompt = [(i * 13 + n) % 150 + 3 for i in range(SERVING_PROMPT)]
            tasks.append(asyncio.create_task(engine.generate(f"serve-{seed}-{n}", prompt, params)))
        await asyncio.sleep(rng.expovariate(rps / 2.5))
    await asyncio.gather(*tasks)
    return n


@dataclass(frozen=True, slots=True)
class Window:
    """One measured configuration at one load level."""

    ttft_p99_s: float
    tpot_p99_s: float
    rollout_tokens_per_s: float
    finished: list[tuple[float, float]]

    def row(self, slo_ttft: float, slo_tpot: float) -> dict[str, float]:
        return {
            "serving_ttft_p99_ms": self.ttft_p99_s * 1e3,
            "serving_tpot_p99_ms": self.tpot_p99_s * 1e3,
            "slo_attainment": attainment(self.finished, slo_ttft, slo_tpot),
            "rollout_tokens_per_s": self.rollout_tokens_per_s,
            "requests": float(len(self.finished)),
        }


def p99(values: Sequence[float]) -> float:
    return float(np.percentile(np.asarray(values), 99)) if values else 0.0


async def measure(
    serving: Any, rollout: Any, mode: str, rps: float, seconds: float, admission: DualSlackAdmission | None
) -> Window:
    stats = StatsCollector()
    serving.attach_observer(stats)
    load = RolloutLoad(rollout, guarded=mode == "guarded") if mode != "alone" else None
    guard_task = None
    if load is not None and admission is not None and mode == "guarded":
        co = CoServing(CoServingGuard(admission), serving, rollout, load.runner, 0.01)
        guard_task = asyncio.create_task(co.run(lambda: False))
    if load is not None:
        load.start()
    started = time.monotonic()
    await serving_traffic(serving, rps, seconds, seed=int(rps * 1000))
    elapsed = time.monotonic() - started
    if guard_task is not None:
        guard_task.cancel()
        await asyncio.gather(guard_task, return_exceptions=True)
        await rollout.resume()
    if load is not None:
        await load.stop()
    tokens = load.tokens if load is not None else 0
    return Window(p99([t for t, _ in stats.finished]), p99(stats.itls), tokens / elapsed, stats.finished)


async def rollout_alone_tokens_per_s(rollout: Any, seconds: float) -> float:
    load = RolloutLoad(rollout, guarded=False)
    load.start()
    started = time.monotonic()
    await asyncio.sleep(seconds)
    rate = load.tokens / (time.monotonic() - started)
    await load.stop()
    return rate


def capacity_rps(profile: EngineProfile) -> float:
    """Serving requests per second one sequence at a time (prefill + every decode step), from the profile."""
    model = profile.latency_model()
    return 1.0 / (model.prefill_s(SERVING_PROMPT) + SERVING_TOKENS * model.decode_step_s(1))


def attainment(finished: Sequence[tuple[float, float]], ttft: float, tpot: float) -> float:
    ok = sum(1 for t, m in finished if t <= ttft and m <= tpot)
    return ok / len(finished) if finished else 1.0


async def run_bench(models_dir: Path, seconds: float, slo_multiple: float = SLO_MULTIPLE) -> dict[str, Any]:
    from rose_core.rl.models import ensure_models
    from rose_executor.engine import VllmEngine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    models = ensure_models(models_dir)
    serving = await VllmEngine.create(
        models.serving, purpose="serving", kv_cache_gib=0.5, max_num_seqs=32, max_model_len=1024
    )
    rollout = await VllmEngine.create(
        models.policy, purpose="rollout", kv_cache_gib=0.5, max_num_seqs=ROLLOUT_CONCURRENCY, max_model_len=1024
    )
    try:
        return await _levels(serving, rollout, seconds, slo_multiple)
    finally:
        serving.shutdown()
        rollout.shutdown()


async def _levels(serving: Any, rollout: Any, seconds: float, slo_multiple: float) -> dict[str, Any]:
    profiles = (await load_or_profile(serving), await load_or_profile(rollout))
    cap = capacity_rps(profiles[0])
    alone = {name: await measure(serving, rollout, "alone", f * cap, seconds, None) for name, f in LEVELS.items()}
    slo_ttft = slo_multiple * max(w.ttft_p99_s for w in alone.values())
    slo_tpot = slo_multiple * max(w.tpot_p99_s for w in alone.values())
    admission = DualSlackAdmission(AdmissionConfig(slo_ttft, slo_tpot), *(p.latency_model() for p in profiles))
    rollout_alone = await rollout_alone_tokens_per_s(rollout, seconds)
    levels: dict[str, Any] = {}
    for name, f in LEVELS.items():
        runs = {"alone": alone[name]}
        for mode in ("unguarded", "guarded"):
            runs[mode] = await measure(serving, rollout, mode, f * cap, seconds, admission)
        idle = max(0.0, 1.0 - f)
        levels[name] = {mode: w.row(slo_ttft, slo_tpot) for mode, w in runs.items()}
        guarded = runs["guarded"].rollout_tokens_per_s
        levels[name]["harvest_ratio"] = guarded / (rollout_alone * idle) if idle and rollout_alone else 0.0
    return {
        "levels": levels,
        "slo_ttft_ms": slo_ttft * 1e3,
        "slo_tpot_ms": slo_tpot * 1e3,
        "rollout_alone_tokens_per_s": rollout_alone,
        "serving_capacity_rps": cap,
    }
