"""The interpreter's teardown, after a command's last line, kept off the terminal.

The trainer's imports load Triton's extension module where it is installed (transformers imports
``torch._dynamo``, which imports ``triton`` to see whether it exists; vLLM's CPU build installs it). When the
interpreter exits, Triton's nanobind bindings report every instance, type and function still alive ("nanobind:
leaked 64 types!", some 35 lines) on stderr, after the run's learning curve, on every run. Nothing leaks that
matters: the process is ending.

``silence_teardown()`` registers an exit handler first, so it runs last of them: it flushes both streams and
points file descriptor 2 at /dev/null, so only what the teardown itself writes there is dropped. Everything
the command wrote before, tracebacks of uncaught exceptions included (printed before exit handlers run), is on
the terminal as before. ``ROSE_TEARDOWN_STDERR=1`` keeps the teardown's output (to debug an exit).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

KEEP = "ROSE_TEARDOWN_STDERR"
_registered: list[bool] = []


def silence_teardown() -> None:
    """Drop what the interpreter's teardown writes to stderr (call early: exit handlers run last-in first-out;
    a second call does nothing)."""
    if os.environ.get(KEEP) != "1" and not _registered:
        atexit.register(_close_stderr)
        _registered.append(True)


def _close_stderr() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing more to show on it
            stream.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
    finally:
        os.close(devnull)
