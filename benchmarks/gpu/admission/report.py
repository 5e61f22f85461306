"""The bench's measurements and output: what the host loop records, per-scenario metrics, the ratios and
targets, the JSON written to ``$OUT/gpu_admission.json`` (after every scenario, so a crash keeps the finished
ones) and the short table on stderr."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .config import Config, log

TPOT_P99_RATIO_MAX = 1.1
"""Target: guarded TPOT-step p99 / serving alone."""
ROLLOUT_RATIO_MIN = 0.40
"""Target: guarded rollout TFLOP/s / rollout alone."""


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]); NaN when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p99": pct(values, 99),
        "mean": sum(values) / len(values),
        "max": max(values),
    }


def clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


class Recorder:
    def __init__(self) -> None:
        self.tpot_step_ms: list[float] = []
        self.first_step_ms: list[float] = []
        self.host_tpot_ms: list[float] = []
        self.first_delay_ms: list[float] = []
        self.busy_gpu_ms = 0.0
        self.full_chunks = 0
        self.green_gemms = 0


def scenario_result(cfg: Config, rec: Recorder, wall: float, b_tpot_ms: float) -> dict[str, Any]:
    flop = rec.full_chunks * cfg.chunk_flop + rec.green_gemms * cfg.green_flop
    ok = sum(1 for t in rec.host_tpot_ms if t <= b_tpot_ms)
    return {
        "tpot_step_ms": summary(rec.tpot_step_ms),
        "first_step_ms": summary(rec.first_step_ms),
        "all_step_ms": summary(rec.tpot_step_ms + rec.first_step_ms),
        "host_tpot_ms": summary(rec.host_tpot_ms),
        "first_token_delay_ms": summary(rec.first_delay_ms),
        "tpot_slo_attainment": ok / len(rec.host_tpot_ms) if rec.host_tpot_ms else None,
        "serving_busy_fraction": rec.busy_gpu_ms / 1e3 / wall if wall > 0 else None,
        "rollout_tflops": flop / wall / 1e12 if wall > 0 else 0.0,
        "rollout_full_chunks": rec.full_chunks,
        "rollout_green_gemms": rec.green_gemms,
        "wall_s": wall,
    }


def ratios(scen: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    alone = scen.get("serving_alone", {})
    roll = scen.get("rollout_alone", {}).get("rollout_tflops")
    idle = None
    if alone.get("serving_busy_fraction") is not None:
        idle = max(1e-9, 1.0 - alone["serving_busy_fraction"])
    for name in ("unmanaged", "blind_duty50", "guarded", "guarded_green"):
        r = scen.get(name)
        if not r:
            continue
        for key, metric in (("tpot", "tpot_step_ms"), ("all_step", "all_step_ms"), ("first_step", "first_step_ms")):
            a, b = alone.get(metric, {}).get("p99"), r.get(metric, {}).get("p99")
            out[f"{name}_{key}_p99_over_alone"] = b / a if a and b is not None and math.isfinite(a) else None
        out[f"{name}_rollout_over_alone"] = r["rollout_tflops"] / roll if roll else None
        out[f"{name}_harvest_ratio"] = r["rollout_tflops"] / (roll * idle) if roll and idle else None
    return out


def targets(g: dict[str, float | None]) -> dict[str, Any]:
    tpot, roll = g.get("guarded_tpot_p99_over_alone"), g.get("guarded_rollout_over_alone")
    serving_met = tpot is not None and tpot <= TPOT_P99_RATIO_MAX
    rollout_met = roll is not None and roll >= ROLLOUT_RATIO_MIN
    return {
        "serving_p99_ratio_max": TPOT_P99_RATIO_MAX,
        "rollout_ratio_min": ROLLOUT_RATIO_MIN,
        "serving_met": serving_met,
        "rollout_met": rollout_met,
        "met": serving_met and rollout_met,
    }


def print_table(res: dict[str, Any]) -> None:
    """A short table on stderr (after the JSON, so it ends the output)."""
    lines = ["scenario | TPOT step p50/p99 ms | first step p99 ms | host TPOT p99 ms | SLO att. | rollout TFLOP/s"]
    for name, r in res.get("scenarios", {}).items():
        t, f, h = r["tpot_step_ms"], r["first_step_ms"], r["host_tpot_ms"]
        lines.append(
            f"{name} | {t.get('p50') or 0:.3f} / {t.get('p99') or 0:.3f} | {f.get('p99') or 0:.3f} | "
            f"{h.get('p99') or 0:.3f} | {r['tpot_slo_attainment'] or 0:.3f} | {r['rollout_tflops']:.1f}"
        )
    g = res.get("ratios", {})
    lines.append(
        f"guarded TPOT p99 / alone = {g.get('guarded_tpot_p99_over_alone')} (target <= {TPOT_P99_RATIO_MAX}); guarded "
        f"rollout / alone = {g.get('guarded_rollout_over_alone')} (target >= {ROLLOUT_RATIO_MIN}); errors: {res.get('errors')}"
    )
    print("\n".join(lines), file=sys.stderr, flush=True)


def write_out(res: dict[str, Any]) -> None:
    out = os.environ.get("OUT")
    if not out:
        return
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_admission.json").write_text(json.dumps(clean(res), indent=1))
    except OSError as exc:
        log(f"cannot write $OUT/gpu_admission.json: {exc}")


@contextlib.contextmanager
def guarded_section(res: dict[str, Any], name: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # one failure must not hide the other scenarios
        res.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
        log(f"{name} FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        if torch.cuda.is_available():
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
    finally:
        write_out(res)
