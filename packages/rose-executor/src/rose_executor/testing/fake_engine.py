"""``FakeEngine``: the in-process twin of ``VllmEngine`` for tests (vLLM v1 keeps one of every multi-process
client so tests run the real code in one process). Not a product feature: nothing in the executor builds one.

It implements the ``Engine`` protocol on a ``rose_core.policy.LatencyModel`` and a ``Clock`` (a
``VirtualClock`` that the test advances, or the wall clock): requests are scheduled in engine steps like
vLLM's (up to ``max_num_seqs`` sequences; decodes first, then prefill chunks within ``max_batched_tokens``),
each step lasts ``model.step_s(decode batch, prefill tokens)`` and ends with one token for every decoding
sequence and the first token of every sequence whose prefill it completed. ``pause(keep_requests=True)``
lands between steps (the step in flight still finishes, as in vLLM); ``abort`` ends a request with reason
``abort``; ``live_requests()`` stamps arrival and last token on the clock. Prefix caching keeps 128-token
blocks of finished prompts (dropped by ``reset_prefix_cache``); token ids are a deterministic function of the
prompt, the position and how many weight versions were committed. Weight versions are pulled for real
(rose-transfer's ``WeightFetcher``) into ``weights``: patches, checksums and rollback are the real ones.
``release_memory`` / ``restore_memory`` act like vLLM's sleep level 1 and wake-up when the twin is built with
``can_release_memory=True`` (its launcher does so for a spec with sleep mode) and refuse otherwise. It records
``calls`` (the protocol's calls in order: ``pause(keep=...)``, ``stage_weights(vN)``, ``release_memory``...),
``started`` (request ids in ``generate`` order), ``aborted`` and ``listeners``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rose_core.policy import LatencyModel, LiveRequest
from rose_core.protocol.messages import SamplingParams
from rose_core.support.errors import RoseError
from rose_executor.engine.clock import WALL_CLOCK, Clock, Timer
from rose_executor.engine.engine_protocol import (
    ActivityListener,
    EngineStatsObserver,
    GenerationOutput,
    WeightCommit,
    WeightOrder,
)
from rose_executor.engine.engine_spec import EngineSpec, Purpose
from rose_executor.testing.health_app import health_app
from rose_transfer.fetch.fetcher import StagedVersion, WeightFetcher
from rose_transfer.resident.resident_weights import ResidentWeights

BLOCK_TOKENS = 128
"""Prefix-cache block (vLLM's CPU backend uses 128-token blocks)."""
FAKE_MODEL_DIR = Path("fake-model")


@dataclass(slots=True, eq=False)
class _Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    logprobs: bool
    arrival_s: float
    cached_tokens: int
    future: asyncio.Future[GenerationOutput]
    top_logprobs: int = 0
    computed: int = 0
    tokens: list[int] = field(default_factory=list)
    first_token_s: float | None = None
    last_token_s: float | None = None

    @property
    def prefill_left(self) -> int:
        return max(1, len(self.prompt) - self.cached_tokens) - self.computed

    @property
    def prefilling(self) -> bool:
        return not self.tokens


class FakeEngine:
    """The ``Engine`` protocol on a latency model and a clock, in this process (see the module docstring)."""

    def __init__(
        self,
        model: LatencyModel,
        clock: Clock = WALL_CLOCK,
        spec: EngineSpec | None = None,
        *,
        max_batched_tokens: int = 2048,
        vocab_size: int = 256,
        can_release_memory: bool = False,
    ) -> None:
        self.model = model
        self.clock = clock
        self.spec = spec or EngineSpec(model_dir=FAKE_MODEL_DIR)
        self.max_batched_tokens = max_batched_tokens
        self.vocab_size = vocab_size
        self.errored = False
        self.can_release_memory = can_release_memory
        """Like a CUDA engine started with sleep mode (True) or a CPU one (False)."""
        self.memory_released = False
        self.kv_tokens = 1 << 16  # the KV cache it reports (kv_cache_tokens)
        self.release_delay_s = 0.0  # how long a release takes (a GPU's sleep: an RPC, other work interleaves)
        self.prefix_reset_ok = True  # False: like vLLM while KV blocks are in use, a reset answers False
        self.calls: list[str] = []
        self.started: list[str] = []
        self.aborted: list[str] = []
        self.listeners: list[ActivityListener] = []
        self.weights_loaded = 0  # versions committed (token ids change with it)
        self.weights = ResidentWeights()  # what the twin holds, pulled for real by stage/commit_weights
        self._fetcher: WeightFetcher | None = None
        self._staging: asyncio.Future[StagedVersion] | None = None
        self._requests: dict[str, _Request] = {}
        self._paused = False
        self.shut_down = False
        """Set by ``shutdown`` (tests check a rollout engine stopped at the end of a lease)."""
        self._step: Timer | None = None
        self._observer: EngineStatsObserver | None = None
        self._cache: set[tuple[int, ...]] = set()

    # ---------------------------------------------------------------- the Engine protocol

    async def generate(
        self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingParams
    ) -> GenerationOutput:
        if self.shut_down:
            raise RoseError(f"the {self.spec.purpose} engine is shut down")
        if request_id in self._requests:
            raise ValueError(f"request {request_id} is already running")
        prompt = [int(t) for t in prompt_token_ids]
        future: asyncio.Future[GenerationOutput] = asyncio.get_running_loop().create_future()
        request = _Request(request_id, prompt, max(1, sampling.max_tokens), sampling.logprobs, self.clock.now(),
                           self._cached_prefix(prompt), future, top_logprobs=sampling.top_logprobs)  # fmt: skip
        self._requests[request_id] = request
        self.started.append(request_id)
        self._notify()
        self._schedule_step()
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self._finish(request, "abort")
            raise

    async def abort(self, request_id: str | Sequence[str]) -> None:
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            request = self._requests.get(rid)
            if request is not None:
                self._finish(request, "abort")

    async def pause(self, *, keep_requests: bool = False, clear_cache: bool = False) -> None:
        self.calls.append(f"pause(keep={keep_requests}" + (", clear_cache=True)" if clear_cache else ")"))
        self._paused = True
        if not keep_requests:
            await self.abort(list(self._requests))
        if clear_cache:
            self._cache.clear()

    async def resume(self) -> None:
        self.calls.append("resume")
        self._paused = False
        self._schedule_step()

    async def is_paused(self) -> bool:
        return self._paused

    async def release_memory(self) -> None:
        """Like vLLM's sleep level 1: aborts what runs, drops the prefix cache, stops scheduling."""
        self._require_release("release")
        self.calls.append("release_memory")
        if self.memory_released:
            return
        self.memory_released = True  # unmapped from the start of the call to its end, and after
        self._paused = True
        await self.abort(list(self._requests))
        await asyncio.sleep(self.release_delay_s)
        self._cache.clear()

    async def restore_memory(self) -> None:
        """Like vLLM's wake-up: scheduling resumes (paused before or not)."""
        self._require_release("restore")
        self.calls.append("restore_memory")
        if not self.memory_released:
            return
        self.memory_released = False
        self._paused = False
        self._schedule_step()

    def _require_release(self, what: str) -> None:
        if not self.can_release_memory:
            raise RoseError(
                f"cannot {what} the memory of this fake {self.spec.purpose} engine: built with "
                "can_release_memory=False (like a vLLM engine on CPU or without sleep mode)"
            )

    def live_requests(self) -> list[LiveRequest]:
        return [
            LiveRequest(
                request_id=r.request_id,
                arrival_s=r.arrival_s,
                prompt_tokens=len(r.prompt),
                max_tokens=r.max_tokens,
                tokens_out=len(r.tokens),
                prefilling=r.prefilling,
                last_token_s=r.last_token_s,
                cached_tokens=r.cached_tokens,
            )
            for r in self._requests.values()
        ]

    def kv_cache_tokens(self) -> int:
        return self.kv_tokens

    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    def add_activity_listener(self, listener: ActivityListener) -> None:
        self.listeners.append(listener)

    def remove_activity_listener(self, listener: ActivityListener) -> None:
        if listener in self.listeners:
            self.listeners.remove(listener)

    def attach_observer(self, observer: EngineStatsObserver | None) -> None:
        self._observer = observer

    async def check_weights(self, model_dir: str) -> None:
        self.calls.append("check_weights")

    async def stage_weights(self, order: WeightOrder) -> None:
        """Pull the version for real (rose-transfer, in this process) into the twin's resident weights."""
        self.calls.append(f"stage_weights(v{order.announce.version})")
        self._require_mapped("stage")
        await self.discard_weights()
        if self._fetcher is None:
            self._fetcher = WeightFetcher(order.secret, order.receiver_id)
        fetcher = self._fetcher
        self._staging = asyncio.ensure_future(
            fetcher.stage_into(order.announce, self.weights, relay=order.relay or None)
        )

    async def commit_weights(self, version: int, timeout_s: float) -> WeightCommit:
        self.calls.append(f"commit_weights(v{version})")
        self._require_mapped("commit")
        staging, self._staging = self._staging, None
        if staging is None or self._fetcher is None:
            raise RoseError(f"weight version {version} was never staged in this engine: stage it first")
        staged = await asyncio.wait_for(staging, timeout_s)
        if staged.version != version:
            staged.discard()
            raise RoseError(f"version {staged.version} is staged, not {version}: stage the version to commit")
        full = self.weights.version < 0
        started = time.perf_counter()
        await self._fetcher.commit_staged(staged)
        offsets, dense = staged.touched()
        self.weights_loaded += 1
        return WeightCommit(
            version=version,
            bytes_received=staged.bytes_received,
            stage_s=staged.stage_seconds,
            pulled_at=staged.started + staged.stage_seconds,
            commit_s=time.perf_counter() - started,
            full_sync=full,
            tensors_changed=int(offsets.size > 0) + len(dense),
            digest=self.weights.digest(),
        )

    async def reset_prefix_cache(self) -> bool:
        self.calls.append("reset_prefix_cache")
        if self.prefix_reset_ok:
            self._cache.clear()
        return self.prefix_reset_ok

    def _require_mapped(self, what: str) -> None:
        """Like a GPU engine asleep (level 1 unmaps its memory): writing weights into it is an illegal access."""
        if self.memory_released:
            raise RoseError(f"cannot {what} weights: the engine's memory is released (unmapped on a GPU)")

    async def discard_weights(self) -> None:
        staging, self._staging = self._staging, None
        if staging is None:
            return
        if not staging.done():
            staging.cancel()
            await asyncio.gather(staging, return_exceptions=True)
        elif staging.exception() is None:
            staging.result().discard()

    async def forget_weights(self) -> None:
        await self.discard_weights()
        self.weights.forget()
        self._fetcher = None

    async def lower_cpu_priority(self, nice: int) -> None:
        self.calls.append(f"lower_cpu_priority({nice})")

    async def openai_app(self, served_model_name: str = "", api_key: str = "") -> Any:
        """A stand-in ASGI app: ``/health`` answers 200, everything else 404 (the twin has no OpenAI API)."""
        return health_app

    def shutdown(self) -> None:
        if self.shut_down:
            return
        self.shut_down = True
        for request in list(self._requests.values()):
            self._finish(request, "abort")
        if self._step is not None:
            self._step.cancel()
            self._step = None

    # ---------------------------------------------------------------- engine steps

    def _schedule_step(self) -> None:
        """Start the next step unless one runs, the engine is paused, or there is nothing to do."""
        if self._step is not None or self._paused or self.shut_down or not self._requests:
            return
        running = list(self._requests.values())[: self.spec.max_num_seqs]
        decodes = [r for r in running if not r.prefilling]
        budget = self.max_batched_tokens - len(decodes)
        prefills: list[tuple[_Request, int]] = []
        for request in (r for r in running if r.prefilling):
            chunk = min(request.prefill_left, budget)
            if chunk <= 0:
                break
            prefills.append((request, chunk))
            budget -= chunk
        seconds = self.model.step_s(len(decodes), sum(n for _, n in prefills))
        self._step = self.clock.call_later(seconds, lambda: self._end_step(decodes, prefills, len(running)))

    def _end_step(self, decodes: list[_Request], prefills: list[tuple[_Request, int]], batch: int) -> None:
        self._step = None
        now = self.clock.now()
        ttfts: list[float] = []
        itls: list[float] = []
        for request, chunk in prefills:
            if request.request_id in self._requests:
                request.computed += chunk
                if request.prefill_left <= 0:
                    self._emit(request, now)
                    request.first_token_s = now
                    ttfts.append(now - request.arrival_s)
        for request in decodes:
            if request.request_id in self._requests:
                itls.append(now - (request.last_token_s or now))
                self._emit(request, now)
        finished: list[tuple[float, float]] = []
        for request in [r for r in self._requests.values() if len(r.tokens) >= r.max_tokens]:
            finished.append(self._stats(request))
            self._finish(request, "length")
        if self._observer is not None:
            self._observer.on_scheduler(min(1.0, batch / self.spec.max_num_seqs))
            self._observer.on_iteration(ttfts, itls, finished)
        if finished:
            self._notify()
        self._schedule_step()

    def _emit(self, request: _Request, now: float) -> None:
        position = len(request.tokens)
        seed = hash(tuple(request.prompt)) + 7919 * position + 104729 * self.weights_loaded
        request.tokens.append(seed % (self.vocab_size - 1) + 1)
        request.last_token_s = now

    def _stats(self, request: _Request) -> tuple[float, float]:
        """(TTFT, mean TPOT) of a request that finishes now, as vLLM's stat logger reports them."""
        first = request.first_token_s if request.first_token_s is not None else request.arrival_s
        last = request.last_token_s if request.last_token_s is not None else first
        decoded = len(request.tokens) - 1
        return first - request.arrival_s, (last - first) / decoded if decoded > 0 else 0.0

    def _finish(self, request: _Request, reason: str) -> None:
        if self._requests.pop(request.request_id, None) is None:
            return
        if reason == "abort":
            self.aborted.append(request.request_id)
        elif self.spec.enable_prefix_caching:
            for end in range(BLOCK_TOKENS, len(request.prompt) + 1, BLOCK_TOKENS):
                self._cache.add(tuple(request.prompt[:end]))
        if not request.future.done():
            logprobs = [-1.0] * len(request.tokens) if request.logprobs else []
            top = [[(token + j, -1.0 - j) for j in range(request.top_logprobs)] for token in request.tokens]
            request.future.set_result(GenerationOutput(list(request.tokens), logprobs, reason, request.cached_tokens,
                                                       top if request.top_logprobs else []))

    def _cached_prefix(self, prompt: list[int]) -> int:
        """Tokens of ``prompt`` in cached full blocks (never the whole prompt: its last token is computed)."""
        cached = 0
        for end in range(BLOCK_TOKENS, len(prompt), BLOCK_TOKENS):
            if tuple(prompt[:end]) not in self._cache:
                break
            cached = end
        return cached

    def _notify(self) -> None:
        for listener in list(self.listeners):
            listener()


class FakeEngineLauncher:
    """Starts ``FakeEngine``s for the agent (its ``EngineLauncher``): one latency model per purpose."""

    def __init__(self, models: Mapping[Purpose, LatencyModel], clock: Clock = WALL_CLOCK) -> None:
        self.models = models
        self.clock = clock
        self.engines: list[FakeEngine] = []

    async def start(self, spec: EngineSpec) -> FakeEngine:
        spec.require_model()
        engine = FakeEngine(self.models[spec.purpose], self.clock, spec, can_release_memory=spec.enable_sleep_mode)
        self.engines.append(engine)
        return engine

    def close(self) -> None:
        return None
