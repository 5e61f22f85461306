"""Ctrl-C and SIGTERM during a run, as one exception the run's ``finally`` handles (every child stopped, the
report written, exit 130); SIGUSR1 as a request to stop cleanly after the step in flight (``StopRequest``)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Interrupted(KeyboardInterrupt):
    """What Ctrl-C and SIGTERM raise during a run, instead of a bare ``KeyboardInterrupt``.

    CPython flags a bare ``KeyboardInterrupt`` that leaves code run by ``exec()`` (a dataclass being created
    while torch or transformers import) as unhandled even when it is caught further up, and at exit kills
    itself with SIGINT whatever status it was asked to exit with (`rose run` then ended -2 instead of 130
    in about half of the interrupts). It checks the exception's type exactly: a subclass is not flagged."""


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``Interrupted``, or carries one as its cause or context: a signal that lands while a
    module imports can surface wrapped (seen: "Error calling __set_name__" raised from a dataclass whose class
    body the interrupt cut, a `RuntimeError` whose cause was the ``Interrupted``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, Interrupted):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread while the run goes."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class StopRequest:
    """SIGUSR1 during a run: finish the step in flight (its training, its weights shipped, a checkpoint when
    ``rl.checkpoint.every`` is on), then end as a completed run short of ``rl.steps``. What a scheduler sends
    before preempting a job (Slurm's ``--signal=USR1@120``), or an operator who wants the job's hosts back
    without losing the step."""

    def __init__(self) -> None:
        self.requested = False

    @contextmanager
    def on_signal(self, sig: signal.Signals = signal.SIGUSR1) -> Iterator[StopRequest]:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.requested = True

        previous = signal.signal(sig, handler)
        try:
            yield self
        finally:
            signal.signal(sig, previous)
