"""The startup heap frozen out of full collections (``rose_core.support.heap``), in a child process: freezing is
process-wide and must not touch the test runner's heap."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json
from rose_core.support.heap import freeze_startup_heap
startup = [{"n": i, "payload": [i] * 4} for i in range(200_000)]  # a long-lived startup heap
frozen = freeze_startup_heap()
cycle = []; cycle.append(cycle); del cycle  # garbage made after the freeze is still collected
print(json.dumps({"objects": frozen.objects, "freeze_count": gc.get_freeze_count(), "collected": gc.collect(),
                  "before": frozen.full_pass_before_s, "after": frozen.full_pass_after_s, "alive": len(startup)}))
"""


def test_the_startup_heap_is_frozen_and_later_garbage_still_collected() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    got = json.loads(done.stdout)
    assert got["objects"] == got["freeze_count"] > 400_000  # the 200,000 dicts and their lists among them
    assert got["collected"] == 1  # the cycle made after the freeze
    assert got["before"] > 0 and got["after"] > 0 and got["alive"] == 200_000
