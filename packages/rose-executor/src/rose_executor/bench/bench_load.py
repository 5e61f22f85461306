"""The bench's two loads: serving traffic (bursty, open loop, every prompt new) and a rollout load kept at
``ROLLOUT_CONCURRENCY`` turns through a real ``RolloutRunner``; and the stat-logger observers that count what
each engine did in a window."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from rose_core.protocol.messages import SamplingParams, ToController, TurnAborted, TurnRequest, TurnResult
from rose_executor.engine.engine_protocol import Engine, GenerationOutput
from rose_executor.rollout.rollout_runner import RolloutRunner

SERVING_PROMPT, SERVING_TOKENS = 32, 32
ROLLOUT_PROMPT = (512, 896)
"""Rollout prompt lengths, uniform in [lo, hi): agentic turns carry their trajectory's context, so rollout work
is prefill-heavy (one or two 512-token chunks per turn) and lengths differ, so turns do not finish in lockstep."""
ROLLOUT_TOKENS, ROLLOUT_CONCURRENCY = 128, 32
"""32 turns in flight (16 until 2026-12-05, decision 825): at 16 the unguarded rollout missed the SLO at
medium load in the median of only 2 invocations of 3; at 32 nearly every rollout step carries a prefill chunk."""
WARM_UP_TIMEOUT_S = 120.0


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


@dataclass(slots=True)
class TokenCounter:
    """The rollout engine's stat-logger observer: tokens generated, finished turns or not (one per first token,
    one per inter-token gap), so a window's throughput does not depend on which turns happen to end in it."""

    tokens: int = 0

    def on_iteration(
        self, ttfts: Sequence[float], tpots: Sequence[float], finished: Sequence[tuple[float, float]]
    ) -> None:
        self.tokens += len(ttfts) + len(tpots)

    def on_scheduler(self, kv_usage_ratio: float) -> None:
        return None


class RolloutLoad:
    """Keeps ``ROLLOUT_CONCURRENCY`` long rollout turns submitted through a real ``RolloutRunner``. Each turn's
    prompt is drawn from the next of ``seeds``, shared by every window of the bench: no prompt recurs, so no
    window's rollout prefill is served from the prefix cache a previous window filled."""

    def __init__(self, engine: Engine, guarded: bool, seeds: Iterator[int]) -> None:
        self._seeds = seeds
        self._finished = 0
        self._warm = asyncio.Event()
        self._n = 0
        self._stopped = False
        self.runner = RolloutRunner(engine, "bench", ROLLOUT_CONCURRENCY, self._on_reply, guarded=guarded)

    def start(self) -> None:
        for _ in range(ROLLOUT_CONCURRENCY):
            self._submit()

    async def warm_up(self) -> None:
        """Wait until ``ROLLOUT_CONCURRENCY`` turns have finished: the engine is in its steady state, not in the
        first prefill of every turn at once."""
        await asyncio.wait_for(self._warm.wait(), WARM_UP_TIMEOUT_S)

    def _submit(self) -> None:
        self._n += 1
        rng = np.random.default_rng(next(self._seeds))
        prompt = rng.integers(3, 153, int(rng.integers(*ROLLOUT_PROMPT)), dtype=np.int32)
        self.runner.submit(bench_turn(f"r{self._n}", prompt, ROLLOUT_TOKENS))

    def _on_reply(self, msg: ToController) -> None:
        if isinstance(msg, TurnResult):
            self._finished += 1
            if self._finished >= ROLLOUT_CONCURRENCY:
                self._warm.set()
        if isinstance(msg, (TurnResult, TurnAborted)) and not self._stopped:
            asyncio.get_running_loop().call_soon(self._submit)

    async def stop(self) -> None:
        self._stopped = True
        await self.runner.abort_all("shutdown")


async def serving_traffic(engine: Engine, rps: float, seconds: float, seed: int, prompts: Iterator[int]) -> int:
    """Bursty open-loop traffic: bursts of 1-4 requests, burst gaps exponential at ``rps`` on average. Each
    request's prompt comes from the next of ``prompts`` (shared by every window: none recurs, so none is
    answered from the prefix cache an earlier window filled)."""
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=SERVING_TOKENS, temperature=0.0, logprobs=False)
    tasks: list[asyncio.Task[GenerationOutput]] = []
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        burst = rng.randint(1, 4)
        for _ in range(burst):
            n += 1
            prompt = np.random.default_rng(next(prompts)).integers(3, 153, SERVING_PROMPT).tolist()
            tasks.append(asyncio.create_task(engine.generate(f"serve-{seed}-{n}", prompt, params)))
        await asyncio.sleep(rng.expovariate(rps / 2.5))
    await asyncio.gather(*tasks)
    return n


def bench_turn(turn_id: str, prompt: np.ndarray, max_tokens: int) -> TurnRequest:
    return TurnRequest(
        turn_id=turn_id,
        trajectory_id=f"t-{turn_id}",
        attempt=0,
        prompt_token_ids=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, logprobs=False),
        min_version=0,
        max_version=0,
    )
