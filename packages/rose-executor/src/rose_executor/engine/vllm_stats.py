"""vLLM's stat-logger hook, the one source of serving latency: per iteration, TTFT and inter-token latency of
the requests that produced tokens and the KV cache use, forwarded to the observer the executor attaches (the
serving monitor, a bench's counters), and an activity ping to listeners (the guard ticks at once)."""

from __future__ import annotations

import logging
from typing import Any

from rose_core.support.errors import require_extra
from rose_executor.engine.engine_protocol import ActivityListener, EngineStatsObserver

with require_extra("vLLM", "'rose-executor[cpu]' (or [gpu] on a GPU host)"):
    from vllm.config import VllmConfig
    from vllm.v1.metrics.loggers import StatLoggerBase

log = logging.getLogger(__name__)

class StatsRelay:
    """Hands vLLM's stat-logger calls to the observer attached after warm-up."""

    def __init__(self) -> None:
        self.observer: EngineStatsObserver | None = None
        self.listeners: list[ActivityListener] = []

    def attach(self, observer: EngineStatsObserver | None) -> None:
        """Forward vLLM's stats to ``observer`` from now on (None: to nobody)."""
        self.observer = observer

    def factory(self, vllm_config: VllmConfig, engine_index: int = 0) -> StatLoggerBase:
        return _ObserverStatLogger(self, vllm_config, engine_index)


class _ObserverStatLogger(StatLoggerBase):
    """Forwards vLLM's per-iteration serving stats (TTFT, inter-token latency, KV usage) to an observer."""

    def __init__(self, relay: StatsRelay, vllm_config: Any, engine_index: int = 0) -> None:
        self._relay = relay
        self.engine_index = engine_index

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if iteration_stats is not None and iteration_stats.finished_requests:
            for listener in self._relay.listeners:
                listener()
        observer = self._relay.observer
        if observer is None:
            return
        if scheduler_stats is not None:
            observer.on_scheduler(float(scheduler_stats.kv_cache_usage))
        if iteration_stats is None:
            return
        finished = [
            (max(f.e2e_latency - f.decode_time, 0.0), f.mean_time_per_output_token)
            for f in iteration_stats.finished_requests
        ]
        observer.on_iteration(
            iteration_stats.time_to_first_tokens_iter, iteration_stats.inter_token_latencies_iter, finished
        )

    def log_engine_initialized(self) -> None:
        log.debug("ROSE stat logger attached to engine %d", self.engine_index)
