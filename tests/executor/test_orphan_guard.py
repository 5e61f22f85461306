"""The orphan guard reaps what a hard-killed executor leaves behind, and nothing after a clean exit."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

PARENT = """
import subprocess, sys, time
from rose_executor.host.orphan_guard import OrphanGuard
guard = OrphanGuard()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
guard.watch_children()
print(child.pid, guard.watcher_pid, flush=True)
if sys.argv[1] == "clean":
    child.terminate(); child.wait(); guard.close()
else:
    time.sleep(600)
"""


def _start(mode: str) -> tuple[subprocess.Popen[str], int, int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child, watcher = (int(x) for x in parent.stdout.readline().split())
    return parent, child, watcher


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_children_of_a_killed_parent_are_reaped() -> None:
    parent, child, watcher = _start("kill")
    parent.kill()
    parent.wait()
    assert _gone(child, timeout=15), "the orphan survived"
    assert _gone(watcher, timeout=15), "the watcher did not exit"


def test_clean_exit_leaves_nothing_to_do() -> None:
    parent, child, watcher = _start("clean")
    assert parent.wait(timeout=30) == 0
    assert _gone(child, timeout=1) and _gone(watcher, timeout=5)
