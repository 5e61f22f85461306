"""Run `rose run` as a user does (a child process, a config file, a JSON report) and hand the test its report,
with the run's stdout, stderr, exit code and the executors' log tails attached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_report(work: Path, config_text: str, steps: int) -> dict:
    config = work / "rose.toml"
    config.write_text(config_text)
    report = work / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rose_core", "run", "--steps", str(steps), "--config", str(config),
         "--report", str(report)],
        capture_output=True, text=True, timeout=1500, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in (work / "run" / "logs").glob("*.log"))
    assert report.exists(), f"no report; rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\n{logs}"
    data = json.loads(report.read_text())
    data["_stdout"], data["_stderr"], data["_rc"], data["_logs"] = proc.stdout, proc.stderr, proc.returncode, logs
    return data
