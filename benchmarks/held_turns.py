"""What moving held turns does to an RL step (decision 823): `rose run --steps N` (the product's defaults) with
`scheduler.move_held_after_s = 0` (turns a borrowed serving executor's guard holds wait for serving's slack)
and with the default (1 s: they move to a dedicated executor with room), alternating, in one invocation.

    python3 benchmarks/held_turns.py [--steps 30] [--pairs 3] [--lr 1e-9] [--json]

Fixed work: with ``--lr 1e-9`` bf16 absorbs every update, so the policy, and the turns a step asks for, stay
as initialised in every run (at the demo's learning rate the runs learn differently and do different work).
Per run: rollout seconds per step (median, p90, max, total), steps whose rollout took over 3 s, turns per
pool, turns moved, the serving SLO figures. The load generator is seeded: every run sees the same arrivals
from its job's start.
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

[rl]
trainer.lr = {lr}

[scheduler]
move_held_after_s = {after}
"""


def run(work: Path, steps: int, after: float, lr: float) -> dict[str, Any]:
    work.mkdir(parents=True)
    config = work / "rose.toml"
    config.write_text(CONFIG.format(run_dir=work / "run", after=after, lr=lr))
    report = work / "report.json"
    proc = subprocess.run([sys.executable, "-m", "rose_core", "run", "--steps", str(steps), "--config", str(config),
                           "--report", str(report)], check=False, capture_output=True, text=True)
    if not report.exists():
        raise SystemExit(f"rose run wrote no report (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return summary(json.loads(report.read_text()), after)


def summary(report: dict[str, Any], after: float) -> dict[str, Any]:
    rollout = [s["rollout_seconds"] for s in report["steps"]]
    deciles = statistics.quantiles(rollout, n=10) if len(rollout) > 1 else rollout
    turns = {pool: sum(s[f"turns_{pool}"] for s in report["steps"]) for pool in ("dedicated", "serving")}
    return {
        "move_held_after_s": after,
        "ok": report["ok"],
        "steps": len(rollout),
        "rollout_s_median": round(statistics.median(rollout), 3),
        "rollout_s_p90": round(deciles[-1], 3),
        "rollout_s_max": round(max(rollout), 3),
        "rollout_s_total": round(sum(rollout), 2),
        "steps_over_3s": sum(r > 3.0 for r in rollout),
        "turns_by_pool": turns,
        "rollout_ms_per_turn": round(1000 * sum(rollout) / max(1, sum(turns.values())), 1),
        "turns_held_moved": report["turns_held_moved"],
        "turns_overdue": report["turns_overdue"],
        "serving_requests": report["serving_requests"],
        "serving_slo_violations": report["serving_slo_violations"],
        "lost_trajectories": report["lost_trajectories"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=3, help="runs per setting, alternating")
    parser.add_argument("--lr", type=float, default=1e-9, help="the policy's learning rate (tiny: fixed work)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="rose-held-") as tmp:
        for pair in range(args.pairs):
            for after in (0.0, 1.0):
                print(f"run {pair + 1}/{args.pairs}, move_held_after_s = {after} ...", file=sys.stderr, flush=True)
                results.append(run(Path(tmp) / f"{pair}-{after}", args.steps, after, args.lr))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"move_held_after_s={r['move_held_after_s']}: rollout s median {r['rollout_s_median']} p90 "
              f"{r['rollout_s_p90']} max {r['rollout_s_max']} total {r['rollout_s_total']}; steps over 3 s "
              f"{r['steps_over_3s']}; turns {r['turns_by_pool']} ({r['rollout_ms_per_turn']} ms/turn); moved "
              f"{r['turns_held_moved']}; SLO violations {r['serving_slo_violations']} of {r['serving_requests']}; "
              f"ok {r['ok']}")


if __name__ == "__main__":
    main()
