"""Ctrl-C during `rose run` while its vLLM engines start (the Ctrl-C a user gives a slow start, and where a
spawned engine core is easiest to leave behind): the documented exit status (130), the report written (error
"interrupted"), and every child process (executors, their orphan guards and their vLLM engine cores) gone
after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rose_core.app.cli import INTERRUPTED_EXIT

ENGINE_CORE = "multiprocessing.spawn"
"""How a vLLM engine-core process (spawned by its executor) shows in its command line."""


def _processes_mentioning(needle: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (Path("/proc") / pid / "environ").read_bytes()
        except OSError:
            continue
        if needle in cmdline or needle.encode() in environ:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def test_interrupt_stops_every_child(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "rose.toml"
    config.write_text(f'models_dir = "{tmp_path / "models"}"\nrun_dir = "{run_dir}"\n[rl]\nsteps = 50\n')
    marker = f"ROSE_TEST_MARKER_{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rose_core", "run", "--config", str(config), "--report", str(tmp_path / "r.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", marker: "1"},
    )
    lines: list[str] = []
    assert proc.stdout is not None
    while not any(ln.startswith("starting ") for ln in lines) and (line := proc.stdout.readline()):
        lines.append(line)
    deadline = time.monotonic() + 300
    while not any(ENGINE_CORE in p for p in _processes_mentioning(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert any(ENGINE_CORE in p for p in _processes_mentioning(marker)), "".join(lines)
    time.sleep(2.0)  # the engine cores are inside vLLM's start-up
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    output = "".join(lines) + rest
    assert "interrupted" in output, output[-3000:]
    assert proc.returncode == INTERRUPTED_EXIT, output[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["error"] == "interrupted"
    assert f"report: {tmp_path / 'r.json'}" in output
    time.sleep(1.0)
    assert _processes_mentioning(marker) == [], "processes left behind after Ctrl-C"
