"""Child processes of `rose run`: started with their own logs, watched, and always cleaned up."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rose_core.app.run.core_split import pin_process
from rose_core.support.errors import RoseError

PARENT_PID = "{actor-pid}"
"""In an executor's argv for a Ray actor (``ray_executors``): replaced there by the actor's own pid (the
executor's ``--parent-pid``: it stops when its actor is gone)."""


@dataclass(slots=True)
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    reported: bool = False
    """``newly_exited`` has returned it already."""

    def last_lines(self, n: int = 3) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        useful = [ln for ln in lines if ln.strip()]
        return " | ".join(useful[-n:])


class ChildProcesses:
    """Starts children in their own process groups so Ctrl-C reaches only us; we stop them in order."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cores: tuple[int, ...] = ()) -> Child:
        """``cores``: pin the child to them (before it starts a thread: its interpreter is still loading)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("wb")
        proc = subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
        if cores:
            pin_process(proc.pid, cores)
        child = Child(name, proc, log_path, log_file)
        self.children.append(child)
        return child

    def newly_exited(self) -> list[tuple[Child, int]]:
        """Children that exited since the last call, with their exit codes (each reported once)."""
        out = []
        for child in self.children:
            code = child.proc.poll()
            if code is not None and not child.reported:
                child.reported = True
                out.append((child, code))
        return out

    def check_alive(self) -> None:
        """Raise a one-line error naming the first child that exited."""
        for child in self.children:
            code = child.proc.poll()
            if code is not None:
                raise RoseError(
                    f"{child.name} exited with code {code}: {child.last_lines() or 'no output'} (log: {child.log_path})"
                )

    def wait_all(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for child in self.children:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop_all(self, grace_s: float = 20.0) -> None:
        """SIGTERM every child's process group, then SIGKILL what is left after ``grace_s``."""
        self._signal_all(signal.SIGTERM)
        if not self.wait_all(grace_s):
            self._signal_all(signal.SIGKILL)
            self.wait_all(5.0)
        for child in self.children:
            child.log_file.close()

    def _signal_all(self, sig: int) -> None:
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, sig)
