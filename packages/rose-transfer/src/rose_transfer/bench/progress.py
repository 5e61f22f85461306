"""A one-line progress display on stderr, shown only when stderr is a terminal."""

from __future__ import annotations

import sys
import time


class BenchProgress:
    def __init__(self, stages: int, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.stages = stages
        self.done = 0
        self._started = time.perf_counter()

    def stage(self, label: str) -> None:
        """Mark the start of the next stage called ``label``."""
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // max(self.stages, 1)
        elapsed = time.perf_counter() - self._started
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {elapsed:6.1f} s  {label:<40}")
        sys.stderr.flush()
        self.done += 1

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 90 + "\r")
            sys.stderr.flush()
