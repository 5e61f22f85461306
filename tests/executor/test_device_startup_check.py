"""The prepared device check of issue 32 (`benchmarks/gpu/startup_check.py`) runs green here for its CPU parts:
the commit path (copies into parameters, each checked where it lives) with its figures; the fork check says it
needs a GPU. Its GPU parts run in `benchmarks/gpu/device_check.sh` on a lent device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "startup_check.py"


def test_the_device_check_runs_its_cpu_parts_and_names_what_needs_a_gpu() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["cuda"] is False and report["fork"] == {"skipped": "needs an NVIDIA GPU"}
    commit = report["commit"]
    assert commit["device"] == "cpu" and commit["whole"]["bytes"] == commit["version_bytes"] > 0
    assert 0 < commit["patch_1pct"]["bytes"] < commit["whole"]["bytes"] and commit["whole"]["seconds"] > 0
