"""Stops vLLM's engine-core processes when the executor dies without stopping them (SIGKILL, OOM killer).

vLLM's engine core (and its workers) outlive a frontend killed hard. ``OrphanGuard`` starts a tiny watcher
process (``python -m rose_executor.host.orphan_guard``, in its own session so terminal signals skip it) and
tells it, over its stdin, which processes to look after. When that pipe closes (the executor exited, however
it exited) the watcher terminates whatever of them is still alive, with their children. After a clean
shutdown nothing is left, and it just exits.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import psutil

GRACE_S = 10.0


class OrphanGuard:
    """The executor's side: start the watcher, hand it process ids, close it at exit."""

    def __init__(self) -> None:
        self._watcher = subprocess.Popen(
            [sys.executable, "-m", "rose_executor.host.orphan_guard"],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        self._watched: set[int] = set()

    @property
    def watcher_pid(self) -> int:
        return self._watcher.pid

    def watch_children(self) -> None:
        """Look after every current descendant of this process (except the watcher)."""
        for child in psutil.Process().children(recursive=True):
            if child.pid == self._watcher.pid or child.pid in self._watched:
                continue
            with contextlib.suppress(psutil.Error):
                if any("resource_tracker" in part for part in child.cmdline()):
                    continue  # multiprocessing's tracker exits with this process on its own
                self._send(f"{child.pid} {child.create_time()!r}\n")
                self._watched.add(child.pid)

    def close(self) -> None:
        """Close the pipe: the watcher reaps what is left and exits."""
        stdin = self._watcher.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._watcher.wait(GRACE_S + 5)

    def _send(self, line: str) -> None:
        if self._watcher.stdin is not None:
            self._watcher.stdin.write(line.encode())
            self._watcher.stdin.flush()


def _survivors(watched: list[tuple[int, float]]) -> list[psutil.Process]:
    found: list[psutil.Process] = []
    for pid, created in watched:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                found.extend([proc, *proc.children(recursive=True)])  # same process, not a recycled pid
    return found


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.Error:
        return "?"


def _reap(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def main() -> None:
    """The watcher: read ``PID CREATE_TIME`` lines until EOF, then reap the survivors."""
    watched: list[tuple[int, float]] = []
    for line in sys.stdin:
        pid, created = line.split()
        watched.append((int(pid), float(created)))
    time.sleep(0.5)  # let a shutdown that is still running finish on its own
    survivors = _survivors(watched)
    if survivors:
        names = ", ".join(f"{_name(p)} ({p.pid})" for p in survivors)
        print(f"rose-executor orphan guard: stopping leftover processes: {names}", file=sys.stderr, flush=True)
        _reap(survivors)
    os._exit(0)


if __name__ == "__main__":
    main()
