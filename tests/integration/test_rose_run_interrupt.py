"""Ctrl-C during `rose run`: the documented exit status (130), the report written (error "interrupted"), and
every child process (executors and their vLLM engine cores) gone after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rose_core.app.cli import INTERRUPTED_EXIT


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
    deadline = time.monotonic() + 600
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "production traffic" in line or line.lstrip().startswith("1 "):
            break
    assert any("production traffic" in ln for ln in lines), "".join(lines)
    assert len(_processes_mentioning(marker)) >= 3, "executors should be running before the interrupt"
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    output = "".join(lines) + rest
    assert "interrupted" in output, output[-3000:]
    assert proc.returncode == INTERRUPTED_EXIT, output[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["error"] == "interrupted"
    assert f"report: {tmp_path / 'r.json'}" in output
    time.sleep(1.0)
    assert _processes_mentioning(marker) == [], "processes left behind after Ctrl-C"
