"""The bench's device-wait probe: a SCHED_BATCH sleeper beside a SCHED_BATCH spinner on one core reports how
late it woke (the batch device model's non-preemptive wait, kept as the bench guard's admission margin)."""

from __future__ import annotations

import math
import os

from rose_executor.bench.device_wait import measure_device_wait


def test_the_probe_reports_the_lateness_of_many_wake_ups() -> None:
    core = min(os.sched_getaffinity(0))
    wait = measure_device_wait(core, seconds=0.3)
    assert wait.samples >= 10
    assert 0.0 <= wait.p50_s <= wait.p99_s and math.isfinite(wait.p99_s)
