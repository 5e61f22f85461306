"""Runs rollout turns on the rollout engine: admission (version, capacity), the serving-headroom gate,
cancellation, and the TurnResult / TurnAborted replies."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from rose_core.messages import TurnAborted, TurnRequest, TurnResult
from rose_executor import metrics
from rose_executor.warm_trajectories import WarmTrajectories

if TYPE_CHECKING:
    from rose_executor.engine import GenerationOutput, VllmEngine

log = logging.getLogger(__name__)
Send = Callable[[msgspec.Struct], None]
TurnKey = tuple[str, int]


@dataclass(slots=True)
class _Turn:
    request: TurnRequest
    received_at: float
    task: asyncio.Task[None] | None = None
    abort_reason: str = ""
    """Why the executor gives the turn back; empty when the controller cancelled it (no reply)."""


class RolloutRunner:
    """In-flight rollout turns of one executor."""

    def __init__(
        self,
        engine: VllmEngine,
        executor_id: str,
        capacity: int,
        send: Send,
        weight_version: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.executor_id = executor_id
        self.capacity = capacity
        self.weight_version = weight_version
        self.tokens_total = 0
        self.budget_frozen = False
        self.warm = WarmTrajectories()
        self._send = send
        self._clock = clock
        self._turns: dict[TurnKey, _Turn] = {}
        self._gate = asyncio.Event()
        self._gate.set()
        self._refusal = ""
        metrics.WEIGHT_VERSION.set(weight_version)

    # ---------------------------------------------------------------- state

    @property
    def in_flight(self) -> int:
        return len(self._turns)

    @property
    def held(self) -> bool:
        """True while new rollout sequences wait for serving headroom."""
        return not self._gate.is_set()

    def set_headroom(self, ok: bool) -> None:
        """Open the gate (start queued turns) or close it (turns not yet started wait here)."""
        if ok:
            self._gate.set()
        else:
            self._gate.clear()

    def refuse(self, reason: str) -> None:
        """Give every new turn back with ``reason`` until ``admit()``."""
        self._refusal = reason

    def admit(self) -> None:
        self._refusal = ""

    def set_version(self, version: int) -> None:
        self.weight_version = version
        self.warm.clear()
        metrics.WEIGHT_VERSION.set(version)

    # ---------------------------------------------------------------- controller requests

    def submit(self, req: TurnRequest) -> None:
        key = (req.turn_id, req.attempt)
        if key in self._turns:
            log.warning("turn %s attempt %d is already running here; ignoring the duplicate", *key)
            return
        reason = self._admission_refusal(req)
        if reason:
            self._reply_aborted(req, reason)
            return
        turn = _Turn(req, self._clock())
        self._turns[key] = turn
        turn.task = asyncio.create_task(self._run(turn), name=f"turn-{req.turn_id}-{req.attempt}")

    def cancel(self, turn_id: str, attempt: int) -> bool:
        """Abort a turn without a reply (the controller no longer wants it)."""
        turn = self._turns.get((turn_id, attempt))
        if turn is None or turn.task is None:
            return False
        turn.abort_reason = ""
        turn.task.cancel()
        metrics.ROLLOUT_TURNS.labels("cancelled").inc()
        return True

    async def abort_all(self, reason: str) -> int:
        """Give every in-flight turn back with ``reason``; returns how many."""
        turns = list(self._turns.values())
        for turn in turns:
            turn.abort_reason = reason
            if turn.task is not None:
                turn.task.cancel()
        await asyncio.gather(*(t.task for t in turns if t.task is not None), return_exceptions=True)
        return len(turns)

    # ---------------------------------------------------------------- one turn

    def _admission_refusal(self, req: TurnRequest) -> str:
        if self._refusal:
            return self._refusal
        if not req.min_version <= self.weight_version <= req.max_version:
            return "version"
        if len(self._turns) >= self.capacity:
            return "capacity"
        return ""

    async def _run(self, turn: _Turn) -> None:
        req = turn.request
        try:
            await self._gate.wait()
            started = self._clock()
            version = self.weight_version
            request_id = f"{req.turn_id}:{req.attempt}"
            prompt = np.asarray(req.prompt_token_ids).astype(np.int64).tolist()
            out = await self.engine.generate(request_id, prompt, req.sampling)
        except asyncio.CancelledError:
            if turn.abort_reason:
                self._reply_aborted(req, turn.abort_reason)
            return
        except Exception as exc:
            log.warning("turn %s failed on the engine: %s", req.turn_id, exc)
            self._reply_aborted(req, f"engine_error: {type(exc).__name__}: {exc}"[:500])
            return
        finally:
            self._turns.pop((req.turn_id, req.attempt), None)
        if out.finish_reason == "abort" or version != self.weight_version:
            self._reply_aborted(req, turn.abort_reason or "engine_error: aborted by the engine")
            return
        self._reply_result(req, out, version, started - turn.received_at, self._clock() - started)

    def _reply_result(self, req: TurnRequest, out: GenerationOutput, version: int, queued: float, ran: float) -> None:
        self.tokens_total += len(out.token_ids)
        self.warm.touch(req.trajectory_id, self._clock())
        metrics.ROLLOUT_TURNS.labels("ok").inc()
        metrics.ROLLOUT_TOKENS.inc(len(out.token_ids))
        self._send(
            TurnResult(
                turn_id=req.turn_id,
                trajectory_id=req.trajectory_id,
                attempt=req.attempt,
                executor_id=self.executor_id,
                weight_version=version,
                output_token_ids=np.asarray(out.token_ids, dtype=np.int32),
                output_logprobs=np.asarray(out.logprobs, dtype=np.float32),
                finish_reason=out.finish_reason,
                queue_seconds=queued,
                run_seconds=ran,
                prefix_hit_tokens=out.num_cached_tokens,
            )
        )

    def _reply_aborted(self, req: TurnRequest, reason: str) -> None:
        metrics.ROLLOUT_TURNS.labels(reason.split(":", 1)[0]).inc()
        self._send(
            TurnAborted(
                turn_id=req.turn_id,
                trajectory_id=req.trajectory_id,
                attempt=req.attempt,
                executor_id=self.executor_id,
                reason=reason,
            )
        )
