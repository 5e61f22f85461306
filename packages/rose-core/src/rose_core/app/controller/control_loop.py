"""The controller's one loop: the only caller of ``Controller.pump``.

Everything on the controller's side runs on the thread that runs this loop: message handling, the control
tick, the attached job's hooks (``JobHooks.on_result``, ``on_tick``), the watchdogs. A job does not pump;
it waits for what it needs (a rollout finished, weights applied everywhere, executors registered, a training
thread done) as a ``Future`` the controller or the job resolves, through ``wait`` or ``result``, and the loop
pumps meanwhile.

Invariant: waits do not nest. A wait is only ever started by the job's own script (``RLJob.run_step`` and
what it calls), never from inside a hook the loop runs; one that is raises at once. So no handler runs
inside another: a result that arrives while the job waits for a weight sync is handled by the loop after
the call that started the sync has returned, never inside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol, TypeVar

T = TypeVar("T")
TICK_S = 0.05
"""The longest the loop waits for a message before it runs the control tick anyway."""


class Pumped(Protocol):
    def pump(self, timeout: float) -> None: ...

    def wake(self) -> None: ...


class NestedWait(RuntimeError):
    """A wait was started from inside the loop (a hook or a watchdog): that would handle messages inside a
    handler. Hooks return at once; what must wait goes in the job's script."""


class ControlLoop:
    """``watchdogs`` run on every turn of the loop (the launcher's check that no executor process exited); they
    may raise to end the wait (and the job)."""

    def __init__(self, controller: Pumped, watchdogs: Sequence[Callable[[], None]] = ()) -> None:
        self.controller = controller
        self.watchdogs = list(watchdogs)
        self._waiting = False
        self._turning = False

    def wait(self, future: Future[T], until: float = float("inf")) -> bool:
        """Run the loop until ``future`` is done (True) or the monotonic clock reaches ``until`` (False)."""
        if self._waiting or self._turning:
            raise NestedWait("a wait started inside the controller's loop (from a hook or a watchdog)")
        self._waiting = True
        try:
            while not future.done():
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self.turn(min(TICK_S, left))
            return True
        finally:
            self._waiting = False

    def result(self, future: Future[T], timeout: float, timed_out: Callable[[], Exception]) -> T:
        """``future``'s result (or its exception), running the loop meanwhile; ``timed_out()`` is raised when it is
        not done within ``timeout`` seconds."""
        if not self.wait(future, time.monotonic() + timeout):
            raise timed_out()
        return future.result()

    def run_in_thread(self, body: Callable[[], T], name: str) -> Future[T]:
        """``body`` on a thread of its own; the future is done (and the loop woken) when it returns or raises."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(body())
            except BaseException as exc:  # handed to the waiter, which raises it
                future.set_exception(exc)
            self.controller.wake()

        threading.Thread(target=run, name=name, daemon=True).start()
        return future

    def turn(self, timeout: float = TICK_S) -> None:
        """One turn: the watchdogs, then the messages that arrived (waiting up to ``timeout`` for the first),
        then the control tick."""
        if self._turning:
            raise NestedWait("a turn of the controller's loop started inside another (from a hook)")
        self._turning = True
        try:
            for check in self.watchdogs:
                check()
            self.controller.pump(timeout)
        finally:
            self._turning = False
