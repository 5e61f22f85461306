"""Ctrl-C and SIGTERM during a run are recognised however they surface; SIGUSR1 asks for a clean stop."""

from __future__ import annotations

import dataclasses
import os
import signal

from rose_core.app.run.interrupts import Interrupted, StopRequest, caused_by_interrupt, signals_as_interrupt


class Cut:
    """A descriptor whose ``__set_name__`` is where the signal lands, as it did in a dataclass body mid-import."""

    def __set_name__(self, owner: type, name: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupt_that_lands_in_a_class_body_is_recognised_wrapped_or_not() -> None:
    """Python 3.11 wraps what ``__set_name__`` raises in a ``RuntimeError`` (3.12 adds a note instead)."""
    caught: BaseException | None = None
    with signals_as_interrupt():
        try:
            @dataclasses.dataclass
            class State:
                field: object = Cut()
        except BaseException as exc:  # what the run's handler sees, whatever it is
            caught = exc
    assert caught is not None and caused_by_interrupt(caught)
    assert isinstance(caught, RuntimeError | Interrupted)


def test_other_errors_are_not_interrupts() -> None:
    try:
        try:
            raise ValueError("inner")
        except ValueError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        assert not caused_by_interrupt(exc)
    assert caused_by_interrupt(Interrupted("signal SIGTERM"))


def test_sigusr1_asks_for_a_stop_after_the_step_and_raises_nothing() -> None:
    """A clean stop is a flag the step loop reads between steps, never an exception in the middle of one; the
    handler before it comes back afterwards."""
    before = signal.getsignal(signal.SIGUSR1)
    with StopRequest().on_signal() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGUSR1)  # to this process: its handler runs before the next line
        assert stop.requested
    assert signal.getsignal(signal.SIGUSR1) == before
