"""``rose-executor`` dispatches ``bench`` to the benchmark command and anything else to the agent."""

from __future__ import annotations

import subprocess
import sys


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
