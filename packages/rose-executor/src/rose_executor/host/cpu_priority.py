"""The rollout side's CPU priority on a serving host: every thread of a process at a lower priority (a higher
``nice``), so that the kernel runs production's CPU work first whenever both want a core.

A serving host shares its CPUs between production (its engine's busy loop and workers, the HTTP front end) and
the lent rollout engine (its busy loop, its workers, the weight versions it pulls, decompresses and applies).
The guard decides *when* rollout may step; this decides who gets a core in the microseconds between: a rollout
engine at nice 19 has a CFS weight of 15 against production's 1024, so a production thread that wakes preempts
it, and rollout work (a decode step, a weight pull, a commit) takes what production leaves.

Invariant: one way only. An unprivileged process cannot raise its priority back (``RLIMIT_NICE``), so this is
called once, on processes that stay rollout work for their life (a lent or kept rollout engine's core and
workers), never on the executor's own (production's front end).
Linux sets a priority per thread (``setpriority(PRIO_PROCESS, tid)``): every thread alive now is set, and
threads started later inherit their creator's.
"""

from __future__ import annotations

import os
from pathlib import Path


def lower_process(pid: int, nice: int) -> int:
    """Every thread of process ``pid`` (this user's) at ``nice`` (or lower already: a higher value is kept); how
    many threads were set. Where there is no ``/proc`` (not Linux), the whole process as the OS sets it."""
    if not 0 <= nice <= 19:
        raise ValueError(f"nice must be in [0, 19] (got {nice})")
    tasks = Path(f"/proc/{pid}/task")
    threads = [int(tid) for tid in os.listdir(tasks)] if tasks.is_dir() else [pid]
    for tid in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    return len(threads)


def lower_engine_worker(nice: int, frontend_pid: int) -> int:
    """Called in a vLLM engine's worker: its process and, when that is a process of its own under the engine
    core (vLLM's multiprocessing executor), the engine core's, at ``nice``; never the front end's
    (``frontend_pid``: the executor's own process, where production's HTTP server runs). Threads set."""
    count = lower_process(os.getpid(), nice)
    parent = os.getppid()
    if parent not in (frontend_pid, 1):
        count += lower_process(parent, nice)
    return count
