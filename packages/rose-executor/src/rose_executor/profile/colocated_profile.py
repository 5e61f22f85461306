"""Serving latency with the rollout engine saturated beside it: what the SLO guard predicts serving with.

Where the two engines time-slice one device (two engine-core processes on the same CPU cores here; two CUDA
contexts on a GPU), a running rollout engine does not add one step to a serving step, it slows serving down
for as long as both run. The alone profile (``latency_profile``) cannot see that; this profile measures the
serving engine again while the rollout engine runs a saturating load (``max_num_seqs`` sequences of 64-token
prompts, resubmitted as they finish) and keeps the *slowest* of ``COLOCATED_REPEATS`` measurements per point:
the guard protects a p99, not a median. The guard's serving model is the pointwise maximum of the two profiles
(``guard_serving_model``). Cached like the alone profile, keyed by both models and the device.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import numpy as np

from rose_core.policy import LatencyModel
from rose_core.protocol.messages import SamplingParams
from rose_executor.engine.engine_protocol import Engine
from rose_executor.profile.latency_profile import (
    EngineProfile,
    cached_profile,
    profile_engine,
    profile_key,
    vocab_size,
)

COLOCATED_REPEATS = 5
LOAD_PROMPT_TOKENS = 64
LOAD_MAX_TOKENS = 128
LOAD_SEQUENCES = 8


def colocated_key(serving: Engine, rollout: Engine) -> str:
    s, r = serving.spec, rollout.spec
    return (
        f"colocated-{profile_key(Path(s.model_dir), s.dtype, s.profile_device)}"
        f"-with-{profile_key(Path(r.model_dir), r.dtype, r.profile_device)}"
    )


async def load_or_profile_colocated(serving: Engine, rollout: Engine, cache_dir: Path | None = None) -> EngineProfile:
    """The cached co-located serving profile of this pair of models on this device, or a fresh one."""
    key = colocated_key(serving, rollout)

    async def measure() -> EngineProfile:
        async with SaturatingLoad(rollout):
            return await profile_engine(serving, key, COLOCATED_REPEATS, max)

    return await cached_profile(key, cache_dir, measure, "serving beside the rollout engine")


def guard_serving_model(alone: EngineProfile, colocated: EngineProfile | None) -> LatencyModel:
    """The serving latency model of the SLO guard: per profiled point the slower of alone and co-located."""
    if colocated is None:
        return alone.latency_model()
    return LatencyModel.fit(_pointwise_max(alone.prefill_points, colocated.prefill_points),
                            _pointwise_max(alone.decode_points, colocated.decode_points))  # fmt: skip


def _pointwise_max(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> list[tuple[int, float]]:
    merged = dict(a)
    for x, y in b:
        merged[x] = max(y, merged.get(x, 0.0))
    return sorted(merged.items())


class SaturatingLoad:
    """``LOAD_SEQUENCES`` (at most the engine's ``max_num_seqs``) rollout generations kept in flight."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._stopped = False
        self._tasks: list[asyncio.Task[None]] = []
        self._ids: set[str] = set()
        self._vocab = vocab_size(Path(engine.spec.model_dir))
        self._max_tokens = max(1, min(LOAD_MAX_TOKENS, engine.spec.max_model_len - LOAD_PROMPT_TOKENS - 2))

    async def __aenter__(self) -> SaturatingLoad:
        n = min(LOAD_SEQUENCES, self.engine.spec.max_num_seqs)
        self._tasks = [asyncio.create_task(self._loop(i)) for i in range(n)]
        await asyncio.sleep(0.2)  # let every sequence get past its first prefill
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stopped = True
        if self._ids:
            await self.engine.abort(list(self._ids))
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _loop(self, i: int) -> None:
        rng = np.random.default_rng(i)
        params = SamplingParams(max_tokens=self._max_tokens, temperature=1.0, logprobs=False)
        n = 0
        while not self._stopped:
            n += 1
            rid = f"rose-profile-load-{i}-{n}"
            self._ids.add(rid)
            try:
                await self.engine.generate(rid, rng.integers(1, self._vocab, LOAD_PROMPT_TOKENS).tolist(), params)
            finally:
                self._ids.discard(rid)
