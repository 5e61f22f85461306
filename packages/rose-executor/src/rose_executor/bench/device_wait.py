"""How long work queued on the bench's device waits for it: the wake-up delay of a ``SCHED_BATCH`` process on
a core another ``SCHED_BATCH`` process keeps busy (the ``batch`` device model's non-preemptive wait).

Under that device model a serving step that becomes ready waits for the rollout worker's time slice to end,
as work queued on a time-sliced GPU waits for the running context's slice; the guard's hold margin covers the
rollout *step* a hold cannot stop, not this wait. The bench measures it here, on the workers' core, before its
windows, and keeps its p99 as admission margin (``GuardSettings.margin_s``; in production the same knob is
``admission_margin_ms``, the device's time slice where it has one).

Two child processes, both pinned to ``core`` under ``SCHED_BATCH``: a spinner, and a sleeper that sleeps
``nap_s`` again and again and records how late it wakes.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from dataclasses import dataclass

_SPINNER = """
import os, sys, time
os.sched_setaffinity(0, {{{core}}})
os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    pass
"""
_SLEEPER = """
import os, sys, time
os.sched_setaffinity(0, {{{core}}})
os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
time.sleep(0.05)
end, late = time.monotonic() + {seconds}, []
while time.monotonic() < end:
    t0 = time.monotonic()
    time.sleep({nap})
    late.append(time.monotonic() - t0 - {nap})
print(" ".join(f"{{x:.6f}}" for x in late))
"""


@dataclass(frozen=True, slots=True)
class DeviceWait:
    p50_s: float
    p99_s: float
    samples: int


def measure_device_wait(core: int, seconds: float = 1.0, nap_s: float = 0.002) -> DeviceWait:
    """The sleeper's lateness on ``core`` beside the spinner, p50 and p99 over ``seconds``."""
    args = {"core": core, "seconds": seconds, "nap": nap_s}
    spinner = subprocess.Popen([sys.executable, "-c", _SPINNER.format(**{**args, "seconds": seconds + 0.5})])
    try:
        out = subprocess.run([sys.executable, "-c", _SLEEPER.format(**args)], capture_output=True, text=True,
                             check=True, timeout=seconds + 30).stdout
    finally:
        spinner.kill()
        spinner.wait()
    late = sorted(max(0.0, float(x)) for x in out.split())
    if not late:
        raise RuntimeError("the device-wait probe recorded no wake-up: is the core usable?")
    return DeviceWait(statistics.median(late), late[min(len(late) - 1, int(0.99 * len(late)))], len(late))
