"""Run `rose run` as a user does (a child process, a config file, a JSON report) and hand the test its report,
with the run's stdout, stderr, exit code and the executors' log tails attached. ``LiveRun`` lets a test act on
the run while it goes (wait for a step's row, read an executor's metrics, signal a process)."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def run_report(work: Path, config_text: str, steps: int, *args: str) -> dict:
    """`rose run --steps N [args]` to its end; its report."""
    with LiveRun(work, config_text, steps, args=args) as run:
        return run.finish()


class LiveRun:
    """`rose run --steps N` in the background; stdout lines are queued for ``wait_for_row``."""

    def __init__(self, work: Path, config_text: str, steps: int, timeout_s: float = 1500,
                 args: tuple[str, ...] = (), command: str = "run", name: str = "") -> None:
        """``command``: ``run``, or ``controller`` (executors started by the test); ``name`` tells apart the
        report and log of several runs in one ``work``."""
        self.work = work
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        config = work / "rose.toml"
        config.write_text(config_text)
        self.report_path = work / f"report{name}.json"
        self.log_path = work / f"rose-{command}{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rose_core", "-v", command, "--steps", str(steps), "--config", str(config),
             "--report", str(self.report_path), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.stdout: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()
        self._stderr: list[str] = []
        self._readers = [threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines), daemon=True),
                         threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True)]
        for reader in self._readers:
            reader.start()

    def __enter__(self) -> LiveRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _pump(self, stream: object, lines: queue.Queue[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)

    def _drain(self, stream: object) -> None:
        """Keep the run's log (``rose -v``: the controller's stalls, re-routes and discards), and a copy beside the
        executors' logs, where it stays for a look after a test that hung or timed out."""
        with self.log_path.open("a") as out:
            for line in stream:  # type: ignore[attr-defined]
                self._stderr.append(line)
                out.write(line)
                out.flush()

    def wait_for_row(self, step: int, timeout_s: float = 600) -> None:
        """Until the per-step table printed ``step``'s row (that step, and its weight sync, are done)."""
        self._await_line(re.compile(rf"^\s*{step}\s+\d+\s+\d+\s"), f"step {step}'s row", timeout_s)

    def wait_for_line(self, pattern: str, timeout_s: float = 600) -> re.Match[str]:
        """Until stdout printed a line matching ``pattern`` (searched, printed lines included); its match."""
        wanted = re.compile(pattern)
        for line in self.stdout:
            if found := wanted.search(line):
                return found
        return self._await_line(wanted, repr(pattern), timeout_s)

    def _await_line(self, wanted: re.Pattern[str], what: str, timeout_s: float) -> re.Match[str]:
        """The match of the next line ``wanted`` finds (each line read is kept in ``stdout``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise AssertionError(f"rose run ended before printing {what}: {self.tail()}") from None
                continue
            self.stdout.append(line)
            if found := wanted.search(line):
                return found
        raise AssertionError(f"no {what} within {timeout_s:.0f} s: {self.tail()}")

    def stderr_lines(self) -> list[str]:
        """The run's log (its stderr, ``rose -v``) read so far."""
        return list(self._stderr)

    def log_has(self, pattern: str) -> bool:
        """Whether the run's log (its stderr, ``rose -v``) has a line matching ``pattern`` by now."""
        return re.search(pattern, "".join(self._stderr)) is not None

    def rows_so_far(self) -> int:
        """The last step whose row the table has printed by now (0: none), reading what is queued."""
        row = re.compile(r"^\s*(\d+)\s+\d+\s+\d+\s")
        last = max((int(m.group(1)) for line in self.stdout if (m := row.match(line))), default=0)
        while not self._lines.empty():
            line = self._lines.get()
            self.stdout.append(line)
            if m := row.match(line):
                last = int(m.group(1))
        return last

    def executor_log(self, executor_id: str) -> str:
        path = self.work / "run" / "logs" / f"executor-{executor_id}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logged(self, executor_id: str, pattern: str) -> str:
        """The first group of ``pattern`` in the executor's log."""
        found = re.search(pattern, self.executor_log(executor_id))
        assert found, f"{pattern!r} not in the log of {executor_id}"
        return found.group(1)

    def until(self, what: str, predicate: object, timeout_s: float = 120, every_s: float = 0.02) -> None:
        """Poll ``predicate`` until true; fail (with the run's output, and the last error reading it) at the
        timeout or when the run ended. A predicate that reads a process of the run may raise OSError: once that
        process is gone, or now and then while it runs (a metrics endpoint polled every few milliseconds has
        reset a connection); either is polled again, not a verdict."""
        deadline, error = time.monotonic() + timeout_s, ""
        while True:
            try:
                if predicate():  # type: ignore[operator]
                    return
            except OSError as exc:
                error = f" (last read failed: {exc!r})"
            if time.monotonic() > deadline or self.proc.poll() is not None:
                ended = self.proc.poll() is not None
                raise AssertionError(f"never saw {what}{error} (run ended: {ended}): {self.tail()}")
            time.sleep(every_s)

    def finish(self) -> dict:
        try:
            self.proc.wait(timeout=max(1.0, self.timeout_s - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for reader in self._readers:  # they end at the pipes' EOF
            reader.join(timeout=10)
        while not self._lines.empty():
            self.stdout.append(self._lines.get())
        logs = self.logs()
        assert self.report_path.exists(), f"no report; rc={self.proc.returncode}\n{self.tail()}\n{logs}"
        data = json.loads(self.report_path.read_text())
        data["_stdout"], data["_stderr"] = "".join(self.stdout), "".join(self._stderr)
        data["_rc"], data["_logs"] = self.proc.returncode, logs
        data["_log_files"] = {p.stem: p.read_text(errors="replace") for p in (self.work / "run" / "logs").glob("*.log")}
        return data

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in (self.work / "run" / "logs").glob("*.log"))

    def tail(self) -> str:
        return "".join(self.stdout)[-3000:] + "\n" + "".join(self._stderr)[-5000:]


def metric(url: str, name: str) -> float:
    """One sample of a Prometheus metric at ``url`` (0.0 when absent)."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0
