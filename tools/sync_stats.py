"""Weight-sync figures of a `rose run --report R.json`: median sync, median step (rollout + train + sync),
their ratio, the worst sync against the median, and where the worst one went.

    python3 tools/sync_stats.py R.json [--json]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def summary(report: dict[str, Any]) -> dict[str, Any]:
    steps = report["steps"]
    if not steps:
        raise SystemExit("the report has no steps: did the run fail? (see its `error`)")
    sync = [s["sync_seconds"] for s in steps]
    step = [s["rollout_seconds"] + s["train_seconds"] + s["sync_seconds"] for s in steps]
    median_sync, median_step = statistics.median(sync), statistics.median(step)
    worst = max(steps, key=lambda s: s["sync_seconds"])
    return {
        "steps": len(steps),
        "median_sync_s": median_sync,
        "median_step_s": median_step,
        "sync_share_of_step": median_sync / median_step,
        "max_sync_s": max(sync),
        "max_over_median": max(sync) / median_sync,
        "sync_s": sync,
        "worst_step": worst["step"],
        "worst_breakdown": worst["sync_breakdown"],
        "weight_digest_mismatches": report.get("weight_digest_mismatches", 0),
        "version_mismatches": report["version_mismatches"],
        "ok": report["ok"],
    }


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        raise SystemExit(__doc__)
    s = summary(json.loads(Path(argv[0]).read_text()))
    if "--json" in argv:
        print(json.dumps(s, indent=2))
        return
    print(f"steps {s['steps']}: median sync {s['median_sync_s']:.3f} s, median step {s['median_step_s']:.3f} s "
          f"({s['sync_share_of_step']:.1%}); max sync {s['max_sync_s']:.3f} s = {s['max_over_median']:.1f}x median")
    print("sync per step: " + " ".join(f"{x:.2f}" for x in s["sync_s"]))
    print(f"ok={s['ok']} digest mismatches={s['weight_digest_mismatches']} version mismatches={s['version_mismatches']}")
    parts = {eid: {k: round(v, 3) for k, v in e.items() if k.endswith("_s")}
             for eid, e in s["worst_breakdown"]["executors"].items()}
    print(f"worst step {s['worst_step']}: {parts}")


if __name__ == "__main__":
    main(sys.argv[1:])
