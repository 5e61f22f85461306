"""The control plane's latency benchmarks run as documented, on their real parts (a ``ControlServer``, an
executor process on ``ControllerLink``, the product's HTTP server): tiny runs that check the commands work
and report sane figures, never how fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, f"benchmarks/{script}", *args, "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_the_relay_floor_times_the_gateways_hops() -> None:
    result = run_bench("relay_floor.py", "--calls", "30")
    assert set(result) == {"relay_floor_p50_ms", "relay_floor_p99_ms"}
    assert 0 < result["relay_floor_p50_ms"] <= result["relay_floor_p99_ms"]


def test_the_control_hop_reports_both_links() -> None:
    result = run_bench("control_hop.py", "--calls", "30", "--rounds", "2")
    for link in ("loop", "thread"):
        assert 0 < result[link]["p50_ms"] <= result[link]["p99_ms"]
        assert len(result[link]["round_p50"]) == 2
