"""The hand-off between the gateway's HTTP threads and the controller thread.

An HTTP thread ``submit``s a ``GatewayTurn`` and waits on its future; the controller thread ``take``s the
turns waiting (only while the job accepts turns: in a synchronous job, not while it trains and ships
weights, so every turn runs on the newest version) and sets each future when the turn's result is accepted.
``wake`` interrupts the controller's wait for messages, so a call is routed at once, not on the next 50 ms
tick. Closing fails every waiting future: no HTTP thread waits forever.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from rose_core.protocol.messages import SamplingParams, TurnResult


@dataclass(slots=True, frozen=True)
class TurnOutcome:
    result: TurnResult
    role: str
    """The pool the turn ran in (dedicated or serving)."""


@dataclass(slots=True)
class GatewayTurn:
    turn_id: str
    session_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    future: Future[TurnOutcome] = field(default_factory=Future)


class BridgeClosed(Exception):
    """The job is stopping: the turn was not run (or its result will not come)."""


class TurnFailed(Exception):
    """The controller gave the turn up: it failed on executors more often than ``scheduler.turn_retries``
    allows."""


class TurnBridge:
    def __init__(self, wake: Callable[[], None] = lambda: None) -> None:
        self._wake = wake
        self._waiting: queue.SimpleQueue[GatewayTurn] = queue.SimpleQueue()
        self._abandoned: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._running: dict[str, GatewayTurn] = {}
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, turn: GatewayTurn) -> Future[TurnOutcome]:
        """Any thread. A closed bridge fails the future at once."""
        with self._lock:
            if self._closed:
                turn.future.set_exception(BridgeClosed("the job is stopping"))
                return turn.future
            self._waiting.put(turn)
        self._wake()
        return turn.future

    def take(self) -> list[GatewayTurn]:
        """The controller thread: the turns submitted since the last call, now counted as running."""
        turns = []
        while True:
            try:
                turn = self._waiting.get_nowait()
            except queue.Empty:
                break
            if not turn.future.cancelled():
                self._running[turn.turn_id] = turn
                turns.append(turn)
        return turns

    def abandon(self, turn: GatewayTurn) -> None:
        """Any thread: the caller stopped waiting (its call timed out). Not taken yet: it never will be; taken:
        the controller thread withdraws it (``take_abandoned``), so no executor keeps running it."""
        turn.future.cancel()
        self._abandoned.put(turn.turn_id)
        self._wake()

    def take_abandoned(self) -> list[str]:
        """The controller thread: the turns taken (submitted to the controller) whose callers stopped waiting."""
        out: list[str] = []
        while True:
            try:
                turn_id = self._abandoned.get_nowait()
            except queue.Empty:
                return out
            if self._running.pop(turn_id, None) is not None:
                out.append(turn_id)

    def is_gateway_turn(self, turn_id: str) -> bool:
        return turn_id in self._running

    def resolve(self, outcome: TurnOutcome) -> bool:
        """The controller thread: the turn's accepted result; False when no one waits for it any more."""
        turn = self._running.pop(outcome.result.turn_id, None)
        if turn is None or turn.future.done():
            return False
        turn.future.set_result(outcome)
        return True

    def fail(self, turn_id: str, reason: str) -> None:
        """The controller thread: the turn was given up; its caller gets ``TurnFailed``."""
        turn = self._running.pop(turn_id, None)
        if turn is not None and not turn.future.done():
            turn.future.set_exception(TurnFailed(reason))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        stopping = BridgeClosed("the job is stopping")
        for turn in [*self._running.values(), *self.take()]:
            if not turn.future.done():
                turn.future.set_exception(stopping)
        self._running.clear()
