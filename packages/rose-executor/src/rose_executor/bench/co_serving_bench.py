"""``rose-executor bench``: serving alone / co-located unguarded / co-located guarded, at three bursty loads.

Both engines run in this process (their cores in child processes) with the tiny models of the embedded
default. Serving latency comes from vLLM's stat logger (per finished request: TTFT and mean TPOT; per token:
inter-token latency). The rollout side is the real ``RolloutRunner``: ``ROLLOUT_CONCURRENCY`` (32) turns of
512-895-token prompts and 128 output tokens kept in flight, prefilled in 512-token chunks (the executor's
``prefill_chunk_tokens``), started at once (unguarded) or by the real ``CoServing`` control loop (guarded:
dual-slack admission with the serving model the executor uses, the slower of the alone and co-located
profiles; ticks every 10 ms and at once on a serving arrival or finish; the p99 feedback rule is off so the
figures show the per-tick policy alone). Each co-located window starts once the rollout load is in its steady
state (``ROLLOUT_CONCURRENCY`` turns finished); rollout throughput is every token generated in the window
(the rollout engine's stat logger), and each engine's device time is its workers' CPU time (``worker_cpu``).
Both engines' workers run under ``SCHED_BATCH`` by default (``DEVICE_MODELS``): without it the kernel's
wakeup preemption hands the core to a waking serving worker at once, which no GPU does. No prompt recurs anywhere in the bench (rollout or serving): a window is never served from the prefix cache
an earlier window filled (before, every window replayed the same prompt sequence, and most windows' rollout
prefill was a cache hit: the contention came and went between runs).

Load levels are fractions of the profiled serving capacity one request at a time (prefill of the 32-token
prompt + 32 decode steps at batch 1, from the alone profile): low 0.2, medium 0.5, high 0.8. vLLM batches, so
serving alone is far from saturated at every level (its attainment is the feasibility check). The whole
sequence runs ``repeats`` times on the same engines; every metric is reported as the median over repeats,
with its min / max under ``spread``. SLO budgets are fixed once, before the repeats: ``slo_multiple`` x the
median serving-alone p99 over ``CALIBRATION_PASSES`` passes of the three levels (one noisy window cannot set it;
the last pass is the first repeat's serving-alone windows), the TTFT budget at least that p99 plus the guard's
margin (the rollout step a hold cannot stop and the device's wait: ``CoServingGuard.ttft_floor_s``; a request
arriving while a rollout step runs waits for it, so no co-location keeps a tighter budget). ``slo_ttft_source``
says which set it; every row also has ``slo_attainment_at_multiple``, the same windows against the plain multiple.

``harvest_ratio`` = the rollout engine's device share / (1 - serving's device share), both measured in the same
co-located window: the share of the device time serving left that the rollout used. Both engines' workers are
pinned to the same cores, so the two shares sum to at most 1 and 1.0 is the ceiling; tokens/s are reported
beside it (the rollout turns device time into tokens at about its alone rate).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rose_core.policy import CoServingGuard, GuardSettings, SloBudgets, hold_margin_s
from rose_core.protocol.messages import ToController, TurnResult
from rose_executor.bench.bench_load import (
    ROLLOUT_CONCURRENCY,
    ROLLOUT_PROMPT,
    ROLLOUT_TOKENS,
    SERVING_PROMPT,
    SERVING_TOKENS,
    RolloutLoad,
    StatsCollector,
    TokenCounter,
    bench_turn,
    serving_traffic,
)
from rose_executor.bench.bench_window import (
    LEVELS,
    Window,
    attainment,
    harvest_ratio,
    median,
    p99,
    slo_from_alone,
    summarize,
)
from rose_executor.bench.demo_models import demo_models
from rose_executor.bench.device_wait import measure_device_wait
from rose_executor.bench.worker_cpu import WorkerCpu, descendants
from rose_executor.co_serving.co_serving import CoServing
from rose_executor.engine.engine_protocol import Engine
from rose_executor.profile.colocated_profile import guard_serving_model, load_or_profile_colocated
from rose_executor.profile.latency_profile import EngineProfile, default_cache_dir, load_or_profile
from rose_executor.rollout.rollout_runner import RolloutRunner

log = logging.getLogger(__name__)

PREFILL_CHUNK_TOKENS = 512
"""The rollout engine's prefill chunk: the executor's default ``prefill_chunk_tokens`` (the guard's admission unit)."""
CALIBRATION_PASSES = 3
"""Serving-alone passes over the three levels whose median p99 sets the SLO (9 windows: a single noisy window
set a loose SLO in one of three invocations when the first pass alone did)."""
SLO_MULTIPLE = 1.5
"""Default SLO = 1.5 x the serving-alone p99 (median over the calibration windows): tight enough that co-location without the guard breaks it
on this machine (at 3x it does not), loose enough that serving alone meets it."""
GUARD_TICK_S = 0.01
STATS_LAG_S = 5.0
ACTIVATION_TRIALS = 10
ACTIVATION_PROMPT = 64


@dataclass(frozen=True, slots=True)
class Rig:
    """The two engines and the device time of each (their workers' CPU seconds)."""

    serving: Engine
    rollout: Engine
    serving_cpu: WorkerCpu
    rollout_cpu: WorkerCpu
    rollout_tokens: TokenCounter
    prompt_seeds: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    """Seeds of the rollout prompts, one per turn over the whole bench (see ``RolloutLoad``)."""
    device_model: str = "batch"
    """``DEVICE_MODELS``: how the workers share the core (set on them by ``run_bench``)."""
    serving_seeds: Iterator[int] = field(default_factory=lambda: itertools.count(1_000_000))
    """Seeds of the serving prompts, one per request over the whole bench (see ``serving_traffic``)."""

    def counters(self) -> tuple[float, float, float]:
        """Serving and rollout device core-seconds per device core, rollout tokens generated (cumulative)."""
        cores = len(self.serving_cpu.cores() | self.rollout_cpu.cores())
        return self.serving_cpu.seconds() / cores, self.rollout_cpu.seconds() / cores, float(self.rollout_tokens.tokens)


async def measure(rig: Rig, mode: str, rps: float, seconds: float, guard: CoServingGuard | None) -> Window:
    stats = StatsCollector()
    rig.serving.attach_observer(stats)
    load = RolloutLoad(rig.rollout, mode == "guarded", rig.prompt_seeds) if mode != "alone" else None
    guard_task = None
    if load is not None and guard is not None and mode == "guarded":
        co = CoServing(guard, rig.serving, rig.rollout, load.runner, GUARD_TICK_S)
        guard_task = asyncio.create_task(co.run())
    if load is not None:
        load.start()
        await load.warm_up()
    stats.finished.clear()
    stats.itls.clear()
    before, started = rig.counters(), time.monotonic()
    sent = await serving_traffic(rig.serving, rps, seconds, seed=int(rps * 1000), prompts=rig.serving_seeds)
    elapsed = time.monotonic() - started
    serving_share, rollout_share, tokens_per_s = (
        (b - a) / elapsed for a, b in zip(before, rig.counters(), strict=True)
    )
    await _stats_logged(stats, sent)
    if guard_task is not None:
        if guard_task.done():
            guard_task.result()  # the guard died: raise its error rather than report an unguarded window
        guard_task.cancel()
        await asyncio.gather(guard_task, return_exceptions=True)
        await rig.rollout.resume()
    if load is not None:
        await load.stop()
    ttfts = [t for t, _ in stats.finished]
    return Window(p99(ttfts), p99(stats.itls), tokens_per_s, stats.finished, stats.itls, serving_share, rollout_share)


async def _stats_logged(stats: StatsCollector, sent: int) -> None:
    """Wait (at most ``STATS_LAG_S``) until vLLM's stat logger has reported every request of the window: it logs
    an iteration after handing out its outputs, so the last burst's figures can trail its results."""
    deadline = time.monotonic() + STATS_LAG_S
    while len(stats.finished) < sent and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    if len(stats.finished) < sent:
        log.warning("the stat logger reported %d of %d serving requests", len(stats.finished), sent)


async def rollout_alone(rig: Rig, seconds: float) -> tuple[float, float]:
    """Rollout tokens/s with the device to itself, and its workers' share of the device meanwhile."""
    load = RolloutLoad(rig.rollout, False, rig.prompt_seeds)
    load.start()
    await load.warm_up()
    before, started = rig.counters(), time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - started
    _, share, rate = ((b - a) / elapsed for a, b in zip(before, rig.counters(), strict=True))
    await load.stop()
    return rate, share


def capacity_rps(profile: EngineProfile) -> float:
    """Serving requests per second one sequence at a time (prefill + every decode step), from the profile."""
    model = profile.latency_model()
    return 1.0 / (model.prefill_s(SERVING_PROMPT) + SERVING_TOKENS * model.decode_step_s(1))


DEVICE_MODELS = ("batch", "cfs")
"""How the two engines' workers share their core: ``batch`` (the default), both under ``SCHED_BATCH`` (no wakeup
preemption: serving waits for the rollout worker's slice, like work queued on a time-sliced GPU behind a running
kernel); ``cfs``, the kernel's default (a serving worker that wakes preempts the rollout worker at once, so the
CPU itself already favours serving and co-location without the guard costs serving almost nothing)."""


async def run_bench(
    models_dir: Path, seconds: float, slo_multiple: float = SLO_MULTIPLE, repeats: int = 3, device_model: str = "batch"
) -> dict[str, Any]:
    if device_model not in DEVICE_MODELS:
        raise ValueError(f"device model {device_model!r} is not one of {DEVICE_MODELS}")
    from rose_executor.engine.vllm_engine import VllmEngine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    policy, serving_model = demo_models(models_dir)
    before = descendants()
    serving = await VllmEngine.create(
        serving_model, purpose="serving", kv_cache_gib=0.5, max_num_seqs=32, max_model_len=1024
    )
    try:
        serving_cpu, before, counter = WorkerCpu.spawned_since(before), descendants(), TokenCounter()
        rollout = await VllmEngine.create(
            policy,
            purpose="rollout",
            kv_cache_gib=0.5,
            max_num_seqs=ROLLOUT_CONCURRENCY,
            max_model_len=1024,
            prefill_chunk_tokens=PREFILL_CHUNK_TOKENS,
            observer=counter,
        )
        try:
            rig = Rig(serving, rollout, serving_cpu, WorkerCpu.spawned_since(before), counter, device_model=device_model)
            if device_model == "batch":
                threads = rig.serving_cpu.batch_scheduled() + rig.rollout_cpu.batch_scheduled()
                log.info("device model: %d worker threads under SCHED_BATCH (no wakeup preemption)", threads)
            result = await _bench(rig, seconds, slo_multiple, repeats)
            result["device_model"] = device_model
            return result
        finally:
            rollout.shutdown()
    finally:
        serving.shutdown()


async def _bench(rig: Rig, seconds: float, slo_multiple: float, repeats: int) -> dict[str, Any]:
    alone_profile, rollout_profile = await load_or_profile(rig.serving), await load_or_profile(rig.rollout)
    # the co-located profile depends on how the workers share the core: one cache per device model
    colocated = await load_or_profile_colocated(rig.serving, rig.rollout, default_cache_dir() / f"bench-{rig.device_model}")
    cap = capacity_rps(alone_profile)
    runs: list[dict[str, Any]] = []
    passes = [await _alone_windows(rig, seconds, cap) for _ in range(CALIBRATION_PASSES)]
    alone = passes[-1]
    rollout_model = rollout_profile.latency_model()
    serving_model = guard_serving_model(alone_profile, colocated)
    wait = await asyncio.to_thread(measure_device_wait, min(rig.serving_cpu.cores())) \
        if rig.device_model == "batch" else None
    margin_s = (wait.p99_s if wait else 0.0) + hold_margin_s(rollout_model, ROLLOUT_CONCURRENCY, PREFILL_CHUNK_TOKENS)
    windows = [w for pass_ in passes for w in pass_.values()]
    slo = slo_from_alone(windows, slo_multiple, margin_s)
    slo_multiple_only = slo_from_alone(windows, slo_multiple)
    settings = GuardSettings(
        SloBudgets(*slo), PREFILL_CHUNK_TOKENS, margin_s=wait.p99_s if wait else 0.0, hold_margin=True,
        rollout_batch=ROLLOUT_CONCURRENCY,
    )
    guard = CoServingGuard.build(settings, serving_model, rollout_model)
    for repeat in range(repeats):
        if repeat:
            alone = await _alone_windows(rig, seconds, cap)
        runs.append(await _one_repeat(rig, seconds, cap, (slo, slo_multiple_only), guard, alone, repeat))
    result = summarize(runs)
    result.update(
        slo_ttft_ms=slo[0] * 1e3,
        slo_tpot_ms=slo[1] * 1e3,
        slo_multiple=slo_multiple,
        slo_ttft_multiple_ms=slo_multiple_only[0] * 1e3,
        slo_ttft_source="floor" if slo[0] > slo_multiple_only[0] else "multiple",
        slo_calibration_windows=CALIBRATION_PASSES * len(LEVELS),
        seconds=seconds,
        repeats=repeats,
        serving_capacity_rps=cap,
        guard_margin_ms=guard.admission.config.margin_s * 1e3,
        device_wait_ms={"p50": wait.p50_s * 1e3, "p99": wait.p99_s * 1e3} if wait else None,
        load_fractions=dict(LEVELS),
        rollout_workload=workload(),
        activation=await activation(rig.serving, rig.rollout, guard),
        runs=runs,
    )
    return result


def workload() -> dict[str, Any]:
    return {
        "concurrency": ROLLOUT_CONCURRENCY,
        "prompt_tokens": list(ROLLOUT_PROMPT),
        "output_tokens": ROLLOUT_TOKENS,
        "prefill_chunk_tokens": PREFILL_CHUNK_TOKENS,
        "serving_prompt_tokens": SERVING_PROMPT,
        "serving_output_tokens": SERVING_TOKENS,
    }


async def _alone_windows(rig: Rig, seconds: float, cap: float) -> dict[str, Window]:
    return {name: await measure(rig, "alone", f * cap, seconds, None) for name, f in LEVELS.items()}


async def _one_repeat(
    rig: Rig,
    seconds: float,
    cap: float,
    slos: tuple[tuple[float, float], tuple[float, float]],
    guard: CoServingGuard,
    alone: dict[str, Window],
    repeat: int,
) -> dict[str, Any]:
    """One repeat at every level. ``slos``: the SLO (TTFT, TPOT) the attainment is measured against, and the
    plain ``slo_multiple`` one (``slo_attainment_at_multiple``: the same windows against the SLO before its TTFT
    floor, to show what the floor changes)."""
    slo, plain = slos
    alone_rate, alone_share = await rollout_alone(rig, seconds)
    levels: dict[str, Any] = {}
    for name, f in LEVELS.items():
        windows = {"alone": alone[name]}
        for mode in ("unguarded", "guarded"):
            windows[mode] = await measure(rig, mode, f * cap, seconds, guard)
        levels[name] = {mode: w.row(*slo) for mode, w in windows.items()}
        for mode, w in windows.items():
            levels[name][mode]["slo_attainment_at_multiple"] = attainment(w.finished, *plain)
        levels[name]["harvest_ratio"] = harvest_ratio(windows["guarded"])
        levels[name]["harvest_ratio_unguarded"] = harvest_ratio(windows["unguarded"])
        log.info("repeat %d %s: %s", repeat, name, levels[name])
    return {"levels": levels, "rollout_alone_tokens_per_s": alone_rate, "rollout_alone_device_share": alone_share}


async def activation(serving: Engine, rollout: Engine, guard: CoServingGuard) -> dict[str, Any]:
    """Inactive -> active: the rollout engine held by an idle guard (no turn, nothing reserved), one 64-token
    turn of 1 output token submitted; milliseconds to its result, against the same turn on an active engine."""
    inactive = await _turn_latencies(serving, rollout, guard)
    active = await _turn_latencies(serving, rollout, None)
    return {
        "trials": ACTIVATION_TRIALS,
        "inactive_turn_ms": {"median": median(inactive), "max": max(inactive)},
        "active_turn_ms": {"median": median(active), "max": max(active)},
        "activation_ms": {
            "median": median(inactive) - median(active),
            "max": max(inactive) - median(active),
        },
    }


async def _turn_latencies(serving: Engine, rollout: Engine, guard: CoServingGuard | None) -> list[float]:
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Future[ToController]] = []

    def reply(msg: ToController) -> None:
        pending[-1].set_result(msg)

    runner = RolloutRunner(rollout, "bench", 1, reply, guarded=guard is not None)
    co = CoServing(guard, serving, rollout, runner, GUARD_TICK_S) if guard else None
    guard_task = asyncio.create_task(co.run()) if co is not None else None
    latencies = []
    try:
        for i in range(ACTIVATION_TRIALS):
            await asyncio.sleep(0.1)  # idle: the guard has held the engine (inactive)
            if co is not None and not (co.paused and not co.active):
                raise RuntimeError("the idle guard did not hold the rollout engine")
            pending.append(loop.create_future())
            prompt = (np.arange(ACTIVATION_PROMPT, dtype=np.int32) * 11 + i) % 150 + 3
            started = time.monotonic()
            runner.submit(bench_turn(f"act-{guard is not None}-{i}", prompt, 1))
            answer = await asyncio.wait_for(pending[-1], 30.0)
            if not isinstance(answer, TurnResult):
                raise RuntimeError(f"activation turn did not finish: {answer}")
            latencies.append((time.monotonic() - started) * 1e3)
    finally:
        if guard_task is not None:
            guard_task.cancel()
            await asyncio.gather(guard_task, return_exceptions=True)
            await rollout.resume()
    return latencies


