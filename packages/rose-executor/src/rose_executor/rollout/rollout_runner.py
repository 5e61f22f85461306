"""Runs rollout turns on the rollout engine: admission (version, capacity, memory budget), the SLO guard's
start signal, cancellation and memory aborts, and the TurnResult / TurnAborted replies.

Unguarded (dedicated role) a turn starts at once; guarded (serving role) it waits until the guard's control
tick releases it (``release``). Under a serving-first memory budget, a turn whose KV reservation does not fit
is given back with reason ``memory`` (the scheduler re-routes it)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from rose_core.policy import QueuedTurn, RolloutMemoryUse
from rose_core.protocol.messages import ToController, TurnAborted, TurnRequest, TurnResult
from rose_executor import metrics
from rose_executor.engine.engine_protocol import Engine, GenerationOutput
from rose_executor.memory.serving_first_budget import ServingFirstBudget
from rose_executor.rollout.warm_trajectories import WarmTrajectories

log = logging.getLogger(__name__)
Reply = Callable[[ToController], None]
"""Sends a message to the controller (the agent's link; a list's ``append`` in tests)."""
TurnKey = tuple[str, int]


@dataclass(slots=True)
class _Turn:
    request: TurnRequest
    received_at: float
    kv_bytes: int = 0
    task: asyncio.Task[None] | None = None
    abort_reason: str = ""
    """Why the executor gives the turn back; empty when the controller cancelled it (no reply)."""
    released: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float | None = None

    @property
    def key(self) -> str:
        return f"{self.request.turn_id}:{self.request.attempt}"


class RolloutRunner:
    """In-flight rollout turns of one executor."""

    def __init__(
        self,
        engine: Engine,
        executor_id: str,
        capacity: int,
        send: Reply,
        weight_version: int = 0,
        clock: Callable[[], float] = time.monotonic,
        *,
        guarded: bool = False,
        memory: ServingFirstBudget | None = None,
    ) -> None:
        self.engine = engine
        self.executor_id = executor_id
        self.capacity = capacity
        self.weight_version = weight_version
        self.tokens_total = 0
        self.held = False
        """Set by the guard: True while serving has no slack to lend (the heartbeat's state ``held``)."""
        self.guarded = guarded
        self.memory = memory
        self.warm = WarmTrajectories()
        self.prompt_tokens_total = 0
        self.prefix_hit_tokens_total = 0
        self.aborted_total = 0
        """Turns given back (``TurnAborted``), every reason."""
        self.cancelled_total = 0
        """Turns the controller cancelled (re-routed elsewhere) that this executor stopped."""
        self.cancelled_still_running = 0
        """Of those, how many the engine still held once the turn stopped (0 unless the engine failed to abort)."""
        self.revoked = False
        """The serving owner took the host back: every turn is refused with ``revoked`` from now on (unlike
        ``refuse``, no ``admit`` lifts it)."""
        self._send = send
        self._clock = clock
        self._turns: dict[TurnKey, _Turn] = {}
        self._refusal = ""
        self._submit_listeners: list[Callable[[], None]] = []
        """Called when a guarded turn starts waiting for the guard (the guard ticks at once)."""
        metrics.WEIGHT_VERSION.set(weight_version)

    def add_submit_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever a guarded turn starts waiting for the guard."""
        self._submit_listeners.append(listener)

    def remove_submit_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._submit_listeners:
            self._submit_listeners.remove(listener)

    # ---------------------------------------------------------------- state

    @property
    def in_flight(self) -> int:
        return len(self._turns)

    @property
    def budget_frozen(self) -> bool:
        return self.memory is not None and self.memory.frozen

    def queued(self) -> list[QueuedTurn]:
        """Turns waiting for the guard, oldest first."""
        return [
            QueuedTurn(t.key, len(t.request.prompt_token_ids)) for t in self._turns.values() if not t.released.is_set()
        ]

    def running(self) -> list[str]:
        return [t.key for t in self._turns.values() if t.released.is_set()]

    def memory_uses(self) -> list[RolloutMemoryUse]:
        """KV reservations of the admitted (started) turns."""
        return [
            RolloutMemoryUse(t.key, t.kv_bytes, t.started_at) for t in self._turns.values() if t.started_at is not None
        ]

    def release(self, keys: tuple[str, ...] | list[str]) -> int:
        """Start the queued turns named by the guard; a turn that no longer fits the memory budget is given
        back with reason ``memory``. Returns how many started."""
        wanted = set(keys)
        started = 0
        for turn in list(self._turns.values()):
            if turn.key not in wanted or turn.released.is_set():
                continue
            if not self._fits(turn.kv_bytes):
                self._abort_turn(turn, "memory")
                continue
            self._start(turn)
            started += 1
        self._update_gauges()
        return started

    def abort_keys(self, keys: tuple[str, ...] | list[str], reason: str) -> int:
        """Give the named in-flight turns back with ``reason`` (e.g. ``memory`` after an emergency cut)."""
        wanted = set(keys)
        turns = [t for t in self._turns.values() if t.key in wanted]
        for turn in turns:
            self._abort_turn(turn, reason)
        return len(turns)

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
        kv_bytes = self.memory.rollout_bytes(len(req.prompt_token_ids), req.sampling.max_tokens) if self.memory else 0
        if not self._fits(kv_bytes):
            self._reply_aborted(req, "memory")
            return
        turn = _Turn(req, self._clock(), kv_bytes)
        self._turns[key] = turn
        if not self.guarded:
            self._start(turn)
        turn.task = asyncio.create_task(self._run(turn), name=f"turn-{req.turn_id}-{req.attempt}")
        turn.task.add_done_callback(partial(self._never_ran, turn))
        self._update_gauges()
        if self.guarded:
            for listener in list(self._submit_listeners):
                listener()

    def _start(self, turn: _Turn) -> None:
        turn.started_at = self._clock()
        turn.released.set()

    def _fits(self, kv_bytes: int) -> bool:
        if self.memory is None:
            return True
        used = sum(t.kv_bytes for t in self._turns.values() if t.started_at is not None)
        return self.memory.fits(used, kv_bytes)

    def _abort_turn(self, turn: _Turn, reason: str) -> None:
        turn.abort_reason = reason
        if turn.task is not None:
            turn.task.cancel()

    def _update_gauges(self) -> None:
        running = [t for t in self._turns.values() if t.started_at is not None]
        metrics.ROLLOUT_TOKENS_ADMITTED.set(
            sum(len(t.request.prompt_token_ids) + t.request.sampling.max_tokens for t in running)
        )
        metrics.ROLLOUT_TOKENS_HELD.set(
            sum(len(t.request.prompt_token_ids) for t in self._turns.values() if t.started_at is None)
        )

    def cancel(self, turn_id: str, attempt: int) -> bool:
        """Abort a turn without a reply (the controller no longer wants it)."""
        turn = self._turns.get((turn_id, attempt))
        if turn is None or turn.task is None:
            return False
        turn.abort_reason = ""
        turn.task.cancel()
        metrics.ROLLOUT_TURNS.labels("cancelled").inc()
        return True

    async def drain(self, timeout_s: float, reason: str) -> int:
        """Let the running turns finish on the weights they started on (up to ``timeout_s``); turns still
        waiting for the guard, and those past the timeout, are given back with ``reason``. Returns how
        many were given back. Call after ``refuse`` so no new turn starts meanwhile."""
        waiting = [t for t in self._turns.values() if not t.released.is_set()]
        for turn in waiting:
            self._abort_turn(turn, reason)
        tasks = [t.task for t in self._turns.values() if t.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        late = [t for t in self._turns.values() if t.task is not None and not t.task.done()]
        for turn in late:
            self._abort_turn(turn, reason)
        await asyncio.gather(*(t.task for t in waiting + late if t.task is not None), return_exceptions=True)
        return len(waiting) + len(late)

    async def revoke(self) -> int:
        """The serving owner takes the host back: refuse every turn from now on and give back those in
        flight (reason ``revoked``); returns how many were given back."""
        self.revoked = True
        return await self.abort_all("revoked")

    async def abort_all(self, reason: str) -> int:
        """Give every in-flight turn back with ``reason``; returns how many."""
        aborted = self.abort_now(reason)
        await asyncio.gather(*aborted, return_exceptions=True)
        return len(aborted)

    def abort_now(self, reason: str) -> list[asyncio.Future[None]]:
        """Abort the turns in flight now (later ones are not touched); each replies with ``reason`` once its
        task ends: await the returned futures for that."""
        turns = list(self._turns.values())
        for turn in turns:
            self._abort_turn(turn, reason)
        return [t.task if t.task is not None else _done() for t in turns]

    # ---------------------------------------------------------------- one turn

    def _admission_refusal(self, req: TurnRequest) -> str:
        if self.revoked:
            return "revoked"
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
            await turn.released.wait()
            started = self._clock()
            version = self.weight_version
            request_id = f"{req.turn_id}:{req.attempt}"
            prompt = np.asarray(req.prompt_token_ids).astype(np.int64).tolist()
            out = await self.engine.generate(request_id, prompt, req.sampling)
        except asyncio.CancelledError:
            self._end_cancelled(turn)
            return
        except Exception as exc:
            log.warning("turn %s failed on the engine: %s", req.turn_id, exc)
            self._reply_aborted(req, f"engine_error: {type(exc).__name__}: {exc}"[:500])
            return
        finally:
            self._turns.pop((req.turn_id, req.attempt), None)
            self._update_gauges()
        if out.finish_reason == "abort" or version != self.weight_version:
            self._reply_aborted(req, turn.abort_reason or "engine_error: aborted by the engine")
            return
        self._reply_result(req, out, version, started - turn.received_at, self._clock() - started)

    def _never_ran(self, turn: _Turn, _task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never enters ``_run`` (not even its ``finally``): a turn
        given back or cancelled in the same loop iteration that submitted it (a memory cut, a revoke, a
        controller's cancel) is finished here, or it would stay in flight with no reply."""
        req = turn.request
        if self._turns.get((req.turn_id, req.attempt)) is not turn:
            return  # ``_run`` finished it
        del self._turns[(req.turn_id, req.attempt)]
        self._update_gauges()
        self._end_cancelled(turn)

    def _end_cancelled(self, turn: _Turn) -> None:
        """A cancelled turn's one ending: given back by this runner, its reply; cancelled by the controller
        once it had started, the check that the engine let go of it; before (still waiting for the guard, e.g.
        a held turn the controller moved to a dedicated executor), only the count."""
        if turn.abort_reason:
            self._reply_aborted(turn.request, turn.abort_reason)
        elif turn.started_at is not None:
            self._check_cancelled(turn.key)
        else:
            self.cancelled_total += 1
            log.info("cancelled turn %s before it started (re-routed by the controller)", turn.key)

    def _check_cancelled(self, request_id: str) -> None:
        """A cancelled turn has stopped: the engine must hold no request for it any more."""
        self.cancelled_total += 1
        if any(r.request_id == request_id for r in self.engine.live_requests()):
            self.cancelled_still_running += 1
            log.warning("cancelled turn %s, but the engine still runs its request", request_id)
            return
        log.info("cancelled turn %s (re-routed by the controller); the engine holds no request for it", request_id)

    def _reply_result(self, req: TurnRequest, out: GenerationOutput, version: int, queued: float, ran: float) -> None:
        self.tokens_total += len(out.token_ids)
        self.warm.touch(req.trajectory_id, self._clock())
        metrics.ROLLOUT_TURNS.labels("ok").inc()
        metrics.ROLLOUT_TOKENS.inc(len(out.token_ids))
        self._count_prefix_hits(len(req.prompt_token_ids), out.num_cached_tokens)
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
                **_top_arrays(out, req.sampling.top_logprobs),
            )
        )

    def _count_prefix_hits(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens_total += prompt_tokens
        self.prefix_hit_tokens_total += cached_tokens
        metrics.PROMPT_TOKENS.inc(prompt_tokens)
        metrics.PREFIX_HIT_TOKENS.inc(cached_tokens)
        metrics.PREFIX_HIT_RATIO.set(self.prefix_hit_rate)

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / prompt tokens, over finished turns."""
        return self.prefix_hit_tokens_total / self.prompt_tokens_total if self.prompt_tokens_total else 0.0

    def _reply_aborted(self, req: TurnRequest, reason: str) -> None:
        self.aborted_total += 1
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


def _done() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


def _top_arrays(out: GenerationOutput, k: int) -> dict[str, np.ndarray]:
    """``TurnResult``'s top alternatives, (tokens, k) each, when the turn asked for them."""
    if k <= 0:
        return {}
    ids = np.asarray([[token for token, _ in position] for position in out.top], dtype=np.int32)
    logprobs = np.asarray([[lp for _, lp in position] for position in out.top], dtype=np.float32)
    shape = (len(out.top), k)
    return {"top_token_ids": ids.reshape(shape), "top_logprobs": logprobs.reshape(shape)}
