"""``host/cpu_priority.py``: a process's every thread at a lower CPU priority, in a child process (it cannot be
undone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rose_executor.host.cpu_priority import lower_process

CHILD = """
import json, os, threading
from rose_executor.host.cpu_priority import lower_process

stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
os.setpriority(os.PRIO_PROCESS, before.native_id, 15)  # already lower than asked: kept
earlier = threading.Thread(target=stop.wait); earlier.start()
count = lower_process(os.getpid(), 10)
later = threading.Thread(target=stop.wait); later.start()
seen = {name: os.getpriority(os.PRIO_PROCESS, t.native_id)
        for name, t in (("before", before), ("earlier", earlier), ("later", later))}
seen["main"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
stop.set()
print(json.dumps({"count": count, "nice": seen}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")
def test_every_thread_now_and_later_runs_at_the_lower_priority() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(out.stdout)
    assert seen["count"] >= 3
    assert seen["nice"] == {"before": 15, "earlier": 10, "later": 10, "main": 10}


def test_a_priority_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"nice must be in \[0, 19\]"):
        lower_process(os.getpid(), 20)


WORKER = """
import json, os, sys
from rose_executor.host.cpu_priority import lower_engine_worker
count = lower_engine_worker(7, int(sys.argv[1]))
print(json.dumps({"count": count, "nice": os.getpriority(os.PRIO_PROCESS, 0)}))
"""
ENGINE_CORE = """
import json, os, subprocess, sys
frontend = sys.argv[1]
worker = subprocess.run([sys.executable, "-c", sys.argv[2], frontend], capture_output=True, text=True, check=True)
print(json.dumps({"worker": json.loads(worker.stdout), "core": os.getpriority(os.PRIO_PROCESS, 0)}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")
def test_a_worker_lowers_itself_and_its_engine_core_never_the_front_end() -> None:
    """A worker in a process of its own (vLLM's multiprocessing executor) lowers its engine core too; a worker
    whose parent is the front end (the engine core running its one worker) leaves the front end alone."""
    frontend = str(os.getpid())
    out = subprocess.run([sys.executable, "-c", ENGINE_CORE, frontend, WORKER], capture_output=True, text=True,
                         timeout=60, check=True)
    seen = json.loads(out.stdout)
    assert (seen["worker"]["nice"], seen["core"]) == (7, 7) and seen["worker"]["count"] >= 2
    alone = subprocess.run([sys.executable, "-c", WORKER, frontend], capture_output=True, text=True, timeout=60,
                           check=True)
    assert json.loads(alone.stdout)["nice"] == 7
    assert os.getpriority(os.PRIO_PROCESS, 0) < 7  # this process, the front end: untouched
