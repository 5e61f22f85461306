"""Start-up profile of one engine on this device: prefill time vs prompt tokens, decode step time vs batch.

The points feed ``rose_core.policy.LatencyModel.fit``; they are cached as JSON per model and device under
``cache_dir`` (default ``~/.cache/rose/profiles``) so a restart does not profile again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import msgspec
import numpy as np

from rose_core.policy import LatencyModel
from rose_core.protocol.messages import SamplingParams
from rose_core.support.user_cache import user_cache_dir
from rose_executor.engine.engine_protocol import Engine

log = logging.getLogger(__name__)
PREFILL_TOKENS = (16, 128, 512)
DECODE_BATCHES = (1, 4, 8)
DECODE_STEPS = 16
REPEATS = 3
PROFILE_VERSION = 1


class EngineProfile(msgspec.Struct, kw_only=True, frozen=True):
    """Profiled ``(tokens, seconds)`` prefill points and ``(batch, seconds)`` decode-step points (medians)."""

    key: str
    prefill_points: list[tuple[int, float]]
    decode_points: list[tuple[int, float]]
    measured_at: float = 0.0
    version: int = PROFILE_VERSION

    def latency_model(self) -> LatencyModel:
        return LatencyModel.fit(self.prefill_points, self.decode_points)

    def alone_step_s(self, batch: int) -> float:
        """The profiled decode step at ``batch`` (interpolated by the fitted model)."""
        return self.latency_model().decode_step_s(max(1, batch))


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    max_model_len: int
    max_num_seqs: int

    def prefill_sizes(self) -> list[int]:
        limit = self.max_model_len - DECODE_STEPS - 2
        return sorted({min(n, limit) for n in PREFILL_TOKENS if limit > 1})

    def batches(self) -> list[int]:
        return sorted({min(b, self.max_num_seqs) for b in DECODE_BATCHES})


def default_cache_dir() -> Path:
    return user_cache_dir("profiles")


def profile_key(model_dir: Path, dtype: str, device: str = "") -> str:
    """Model identity (config + weight file sizes) + dtype + device: a profile is only valid for all of them."""
    h = hashlib.sha256((model_dir / "config.json").read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    device = device or f"cpu-{platform.machine()}-{os.cpu_count()}"
    return f"{model_dir.name}-{dtype}-{device}-{h.hexdigest()[:16]}".replace("/", "_")


async def load_or_profile(engine: Engine, cache_dir: Path | None = None) -> EngineProfile:
    """The cached profile of ``engine``'s model on this device, or a fresh one (then cached)."""
    spec = engine.spec
    key = profile_key(Path(spec.model_dir), spec.dtype, spec.profile_device)
    return await cached_profile(key, cache_dir, lambda: profile_engine(engine, key), f"the {spec.purpose} engine")


async def cached_profile(
    key: str, cache_dir: Path | None, measure: Callable[[], Awaitable[EngineProfile]], what: str
) -> EngineProfile:
    """The profile cached under ``key``, or ``measure()``'s (logged, then cached)."""
    path = (cache_dir or default_cache_dir()) / f"{key}.json"
    cached = read_cached(path, key)
    if cached is not None:
        return cached
    started = time.perf_counter()
    profile = await measure()
    log.info("profiled %s in %.1f s: %s", what, time.perf_counter() - started, profile)
    write_cached(path, profile)
    return profile


async def profile_engine(
    engine: Engine,
    key: str,
    repeats: int = REPEATS,
    reduce: Callable[[list[float]], float] = statistics.median,
) -> EngineProfile:
    """Each point is ``reduce`` (default: the median) of ``repeats`` measurements."""
    spec = ProfileSpec(engine.spec.max_model_len, engine.spec.max_num_seqs)
    vocab = vocab_size(Path(engine.spec.model_dir))
    rng = np.random.default_rng(0)

    async def point(measure: Callable[[], Awaitable[float]]) -> float:
        return float(reduce([await measure() for _ in range(repeats)]))

    prefill = [(n, await point(partial(_prefill_s, engine, rng, vocab, n))) for n in spec.prefill_sizes()]
    decode = [(b, await point(partial(_decode_step_s, engine, rng, vocab, b))) for b in spec.batches()]
    return EngineProfile(key=key, prefill_points=prefill, decode_points=decode, measured_at=time.time())


async def _prefill_s(engine: Engine, rng: np.random.Generator, vocab: int, tokens: int) -> float:
    prompt = rng.integers(1, vocab, size=tokens).tolist()
    started = time.perf_counter()
    await engine.generate(_rid("prefill"), prompt, SamplingParams(max_tokens=1, temperature=0.0, logprobs=False))
    return time.perf_counter() - started


async def _decode_step_s(engine: Engine, rng: np.random.Generator, vocab: int, batch: int) -> float:
    """(time of ``batch`` sequences for 1 + DECODE_STEPS tokens - time for 1 token) / generated steps."""

    async def run(max_tokens: int) -> tuple[float, int]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=False)
        prompts = [rng.integers(1, vocab, size=8).tolist() for _ in range(batch)]
        started = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(_rid("decode"), p, params) for p in prompts))
        return time.perf_counter() - started, max(len(o.token_ids) for o in outs)

    first, _ = await run(1)
    full, produced = await run(1 + DECODE_STEPS)
    return max(0.0, full - first) / max(1, produced - 1)


_counter = iter(range(1 << 62))


def _rid(kind: str) -> str:
    return f"rose-profile-{kind}-{next(_counter)}"


def vocab_size(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    return int(config.get("text_config", config).get("vocab_size", 256))


def read_cached(path: Path, key: str) -> EngineProfile | None:
    try:
        profile = msgspec.json.decode(path.read_bytes(), type=EngineProfile)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return profile if profile.key == key and profile.version == PROFILE_VERSION else None


def write_cached(path: Path, profile: EngineProfile) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(profile))
        tmp.replace(path)
    except OSError as exc:
        log.warning("cannot cache the latency profile at %s (%s); it will be measured again next start", path, exc)
