"""``rose-executor`` dispatches ``bench`` and ``revoke`` to their commands and anything else to the agent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def help_text(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rose_executor", *args], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_bench_subcommand_and_agent_help() -> None:
    assert "Usage: rose-executor bench" in help_text("bench", "--help")
    bench = help_text("bench", "--help")
    assert "--json" in bench and "--repeats" in bench and "--slo-multiple" in bench
    agent = help_text("--help")
    assert "--controller" in agent and "rose-executor bench --help" in agent


def test_revoke_finds_the_executor_by_its_id_and_signals_it(tmp_path: Path) -> None:
    """A process started like an executor (``... rose_executor ... --executor-id ID``) gets SIGUSR1."""
    marker = tmp_path / "got-sigusr1"
    script = tmp_path / "rose_executor_standin.py"
    script.write_text(
        "import pathlib, signal, sys, time\n"
        f"signal.signal(signal.SIGUSR1, lambda *_: pathlib.Path({str(marker)!r}).write_text('1'))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script), "--executor-id", "serving-7"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        out = json.loads(help_text("revoke", "serving-7", "--json"))
        assert out == {"executor_id": "serving-7", "signalled": [proc.pid]}
        for _ in range(100):
            if marker.exists():
                break
            time.sleep(0.05)
        assert marker.read_text() == "1"
    finally:
        proc.kill()
        proc.wait()


def test_revoke_names_the_fix_when_there_is_no_such_executor() -> None:
    done = subprocess.run([sys.executable, "-m", "rose_executor", "revoke", "no-such-executor"], check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no rose-executor with --executor-id no-such-executor" in done.stderr
    assert "--pid" in done.stderr
    done = subprocess.run([sys.executable, "-m", "rose_executor", "revoke"], check=False, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "EXECUTOR_ID" in done.stderr
