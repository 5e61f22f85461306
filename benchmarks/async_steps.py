"""Synchronous vs asynchronous RL steps, side by side in one invocation: the same `rose run` job (config,
seed, steps) with `scheduler.staleness = 0` and `= 1`, one after the other (alternating which goes first on
each repeat), each from a cold start like a user's run. Prints steps per minute of each (steps / the step
loop's wall time: start-up excluded, overlap included), their ratio (target >= 1.2x on this machine), and the
reward per step of both.

    python3 benchmarks/async_steps.py [--steps 10] [--repeats 1] [--config lake.toml] [--json]

Runs `python -m rose_core run` with the interpreter running this script (the dev venv or a nox session).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MODES = {"sync": 0, "async": 1}


def run_once(work: Path, base_config: str, steps: int, staleness: int) -> dict[str, Any]:
    config = work / f"staleness-{staleness}.toml"
    run_dir = work / f"run-{staleness}"  # top-level keys first: the shared config may end inside a table
    config.write_text(f'run_dir = "{run_dir}"\n{base_config}\n\n[scheduler]\nstaleness = {staleness}\n')
    report = work / f"report-{staleness}.json"
    out = subprocess.run([sys.executable, "-m", "rose_core", "run", "--steps", str(steps), "--config", str(config),
                          "--report", str(report), "--json"], capture_output=True, text=True, check=False)
    if not report.exists():
        raise SystemExit(f"rose run (staleness {staleness}) wrote no report (rc {out.returncode}):\n{out.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(report.read_text())
    if not data["ok"]:
        raise SystemExit(f"rose run (staleness {staleness}) failed: {data['error']}\n{out.stderr[-3000:]}")
    return data


def figures(report: dict[str, Any]) -> dict[str, Any]:
    steps = report["steps"]
    loop_s = sum(s["step_seconds"] for s in steps)
    return {
        "steps_per_minute": 60.0 * len(steps) / loop_s,
        "loop_seconds": loop_s,
        "reward_per_step": [round(s["reward_mean"], 3) for s in steps],
        "median_rollout_s": statistics.median(s["rollout_seconds"] for s in steps),
        "median_train_s": statistics.median(s["train_seconds"] for s in steps),
        "median_overlap_s": statistics.median(s["overlap_seconds"] for s in steps),
        "max_staleness": max(s["max_staleness"] for s in steps),
        "version_mismatches": report["version_mismatches"],
        "serving_slo_violations": report["serving_slo_violations"],
    }


def bench(steps: int, repeats: int, base_config: str) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="rose-async-bench-") as tmp:
        work = Path(tmp)
        for repeat in range(repeats):
            order = list(MODES) if repeat % 2 == 0 else list(reversed(MODES))
            for mode in order:
                print(f"repeat {repeat + 1}/{repeats}: {mode} ({steps} steps)", file=sys.stderr, flush=True)
                runs[mode].append(figures(run_once(work, base_config, steps, MODES[mode])))
    rate = {mode: statistics.median(r["steps_per_minute"] for r in runs[mode]) for mode in MODES}
    return {"steps": steps, "repeats": repeats, "steps_per_minute": rate,
            "async_over_sync": rate["async"] / rate["sync"], "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--config", type=Path, help="A rose.toml whose settings both runs share (not run_dir).")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = args.config.read_text() if args.config else 'models_dir = ".rose/models"\n'
    if "run_dir" in base or "[scheduler]" in base:
        raise SystemExit("the shared config must not set run_dir or [scheduler]: the bench sets both per run")
    result = bench(args.steps, args.repeats, base)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for mode in MODES:
        last = result["runs"][mode][-1]
        print(f"{mode:>5}: {result['steps_per_minute'][mode]:.2f} steps/min (median of {args.repeats}); "
              f"rollout {last['median_rollout_s']:.1f} s, train {last['median_train_s']:.1f} s, overlap "
              f"{last['median_overlap_s']:.1f} s per step; reward {last['reward_per_step']}")
    print(f"async / sync: {result['async_over_sync']:.2f}x (target >= 1.2x)")


if __name__ == "__main__":
    main()
