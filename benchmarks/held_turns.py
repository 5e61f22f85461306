"""What giving back held turns does to an RL step: `rose run --steps N` (the product, defaults) twice in one
invocation, serving executors with `hold_give_back_s = 0` (turns wait for serving's slack) and with the
default (1 s), in alternation; per run the rollout seconds per step (median, p90, max), the steps whose
rollout took over 3 s, turns per pool, the turns given back as held, and the serving SLO figures.

    python3 benchmarks/held_turns.py [--steps 30] [--pairs 1] [--json]

The load generator is seeded, so both runs see the same serving arrivals (from each job's start).
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

CONFIG = """
run_dir = "{run_dir}"

[executors.serving_overrides]
hold_give_back_s = {give_back}
"""


def run(work: Path, steps: int, give_back: float) -> dict[str, Any]:
    work.mkdir(parents=True)
    config = work / "rose.toml"
    config.write_text(CONFIG.format(run_dir=work / "run", give_back=give_back))
    report = work / "report.json"
    proc = subprocess.run([sys.executable, "-m", "rose_core", "run", "--steps", str(steps), "--config", str(config),
                           "--report", str(report)], check=False, capture_output=True, text=True)
    if not report.exists():
        raise SystemExit(f"rose run wrote no report (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return summary(json.loads(report.read_text()), give_back)


def summary(report: dict[str, Any], give_back: float) -> dict[str, Any]:
    rollout = [s["rollout_seconds"] for s in report["steps"]]
    deciles = statistics.quantiles(rollout, n=10) if len(rollout) > 1 else rollout
    serving = [e for e in report["executors"] if e.get("role") == "serving"]
    return {
        "hold_give_back_s": give_back,
        "ok": report["ok"],
        "steps": len(rollout),
        "rollout_s_median": round(statistics.median(rollout), 3),
        "rollout_s_p90": round(deciles[-1], 3),
        "rollout_s_max": round(max(rollout), 3),
        "rollout_s_total": round(sum(rollout), 2),
        "steps_over_3s": sum(r > 3.0 for r in rollout),
        "turns_by_pool": {pool: sum(s[f"turns_{pool}"] for s in report["steps"]) for pool in ("dedicated", "serving")},
        "serving_aborted_turns": sum(e.get("aborted_turns", 0) for e in serving),
        "serving_guard_hold_s": round(sum(e.get("guard_hold_seconds", 0.0) for e in serving), 2),
        "turns_overdue": report["turns_overdue"],
        "serving_requests": report["serving_requests"],
        "serving_slo_violations": report["serving_slo_violations"],
        "lost_trajectories": report["lost_trajectories"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=1, help="runs per setting, alternating")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="rose-held-") as tmp:
        for pair in range(args.pairs):
            for give_back in (0.0, 1.0):
                print(f"run {pair + 1}/{args.pairs}, hold_give_back_s = {give_back} ...", file=sys.stderr, flush=True)
                results.append(run(Path(tmp) / f"{pair}-{give_back}", args.steps, give_back))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"hold_give_back_s={r['hold_give_back_s']}: rollout s median {r['rollout_s_median']} p90 "
              f"{r['rollout_s_p90']} max {r['rollout_s_max']} total {r['rollout_s_total']}; steps over 3 s "
              f"{r['steps_over_3s']}; turns {r['turns_by_pool']}; given back by serving {r['serving_aborted_turns']}; "
              f"SLO violations {r['serving_slo_violations']} of {r['serving_requests']}; ok {r['ok']}")


if __name__ == "__main__":
    main()
