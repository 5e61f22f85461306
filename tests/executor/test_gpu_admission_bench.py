"""The GPU admission benchmark (benchmarks/gpu/admission): a CPU smoke run of every code path with the documented
command, the guard as the bench builds it against the paper's rule, the loud failure without rose-core, and a
tiny run on CUDA where there is a GPU."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
CO_LOCATED = ("unmanaged", "blind_duty50", "guarded")
BENCH_MODULES = ("benchmarks.gpu.admission", "benchmarks.gpu.admission.schedule", "benchmarks.gpu.admission.bench")


def run_documented(out_dir: Path, *args: str) -> dict[str, Any]:
    """``PYTHONPATH=packages/rose-core/src python -m benchmarks.gpu.admission ...`` from the repository root,
    with ``$OUT`` at ``out_dir`` (never a real run's); the JSON it prints, checked against the one it wrote."""
    env = {**os.environ, "PYTHONPATH": "packages/rose-core/src", "OUT": str(out_dir)}
    cmd = [sys.executable, "-m", "benchmarks.gpu.admission", *args]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "guarded TPOT p99 / alone" in out.stderr  # the table ends the output
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    assert json.loads((out_dir / "gpu_admission.json").read_text()) == result
    return result


@pytest.fixture(scope="module")
def schedule() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))  # as `python -m` from the repository root
        yield importlib.import_module("benchmarks.gpu.admission.schedule")


def _check(res: dict[str, Any]) -> None:
    scen = res["scenarios"]
    assert not res.get("errors"), res.get("errors")
    assert set(("serving_alone", "rollout_alone", *CO_LOCATED)) <= set(scen)
    assert scen["serving_alone"]["tpot_step_ms"]["n"] > 0
    assert scen["serving_alone"]["rollout_tflops"] == 0.0
    assert scen["rollout_alone"]["rollout_tflops"] > 0
    for name in CO_LOCATED:
        assert scen[name]["tpot_step_ms"]["n"] > 0, name
        assert scen[name]["rollout_full_chunks"] > 0, name
    assert res["admission_impl"] == "rose_core.policy.CoServingGuard"
    for key in ("guarded_tpot_p99_over_alone", "guarded_rollout_over_alone", "unmanaged_tpot_p99_over_alone"):
        assert res["ratios"][key] is not None and res["ratios"][key] > 0, key
    assert set(res["targets"]) >= {"serving_met", "rollout_met", "met"}


def test_smoke_on_cpu(tmp_path: Path) -> None:
    res = run_documented(tmp_path, "--smoke", "--device", "cpu", "--seconds", "0.2")
    assert res["backend"] == "cpu"
    assert res["green_context"]["available"] is False
    assert res["latency_model"]["guard_margin_ms"] == pytest.approx(res["latency_model"]["margin_ms"])
    # On a loaded CPU the host-side timings can leave no TPOT slack for a chunk during a burst (the guard doing
    # its job), but an idle gap always has half a chunk of TTFT slack: the guarded scenario harvests there.
    assert res["scenarios"]["guarded"]["admitted_chunks"] > 0
    _check(res)


def test_without_rose_core_the_bench_stops_with_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setitem(sys.modules, "rose_core.policy", None)  # as if rose-core were not on the path
    for name in BENCH_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(SystemExit) as exc:
        importlib.import_module("benchmarks.gpu.admission.bench")
    message = str(exc.value)
    assert "\n" not in message and "PYTHONPATH=packages/rose-core/src python -m benchmarks.gpu.admission" in message


def _guard(schedule: ModuleType, t_dec: float = 2e-3, t_first: float = 2e-3, t_chunk: float = 1e-3,
           ttft: float = 3.5e-3, tpot: float = 2.2e-3, margin: float = 0.0) -> Any:
    lat = schedule.LatencyProfile(t_dec, t_first, t_chunk)
    return schedule.ChunkGuard.build(lat, schedule.SloBudgets(ttft, tpot), margin, 512)


def test_the_guard_as_the_bench_builds_it_gives_the_papers_rule(schedule: ModuleType) -> None:
    guard = _guard(schedule)
    # idle gap: a request arriving now has TTFT slack B_TTFT - T_first - queued work; one 1 ms chunk fits in 1.5
    assert guard.admits(0.0, [schedule.arriving(0.0)])
    assert not guard.admits(0.6e-3, [schedule.arriving(0.0)])
    # decoding with 0.2 ms of TPOT slack: no 1 ms chunk; with 2.2 ms (last token 2 ms later): one chunk
    assert not guard.admits(0.0, [schedule.decoding(0.0, 0.0)])
    assert guard.admits(0.0, [schedule.decoding(-1.0, 2e-3)])
    assert not guard.admits(0.0, [schedule.decoding(0.0, None)])  # the first step: TPOT rule from the arrival
    assert guard.admits(0.0, [])
    assert guard.margin_s == 0.0  # the hold margin: the bench's rollout has no decode step


@given(
    prefill=st.booleans(),
    age=st.floats(0.0, 0.01),
    queued=st.floats(0.0, 0.004),
    margin=st.floats(0.0, 1e-3),
)
def test_the_guard_admits_a_chunk_iff_the_papers_slack_holds(
    schedule: ModuleType, prefill: bool, age: float, queued: float, margin: float
) -> None:
    """``min slack - T_chunk > margin``, slack ``arrival + B_TTFT - now_eff - T_first`` (arriving) or
    ``last_token + B_TPOT - now_eff - T_dec`` (decoding)."""
    t_dec, t_first, t_chunk, ttft, tpot = 2e-3, 2.5e-3, 1e-3, 3.5e-3, 2.2e-3
    guard = _guard(schedule, t_dec, t_first, t_chunk, ttft, tpot, margin)
    now = 1.0
    if prefill:
        request, slack = schedule.arriving(now - age), now - age + ttft - (now + queued) - t_first
    else:
        request, slack = schedule.decoding(now - 1.0, now - age), now - age + tpot - (now + queued) - t_dec
    assume(abs(slack - t_chunk - margin) > 1e-9)  # not on the rounding edge
    assert guard.admits(now + queued, [request]) == (slack - t_chunk > margin)


@pytest.mark.gpu
def test_tiny_run_on_cuda(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    res = run_documented(tmp_path, "--smoke", "--device", "cuda", "--seconds", "0.3")
    assert res["backend"] == "cuda"
    _check(res)
    prof = res["profile"]
    assert prof["serving_step_ms"]["p50"] > 0 and prof["rollout_chunk_ms"]["p50"] > 0
    assert "reason" in res["green_context"]


def test_a_completion_reanchors_the_queued_chunks(schedule: ModuleType) -> None:
    """The guard's view of the rollout queue is closed loop: chunks predicted to have ended (the GPU ran them
    slower than profiled) count again at ``t_chunk`` each once a completion is seen, so the queue the guard
    prices is the queue the GPU holds, not one that drifts behind it over a long idle gap."""
    t_chunk = 1e-3
    view = schedule.View(now=10.0, t_chunk=t_chunk)
    view.full = [schedule.InFlight(handle=None, pred_end=9.0 + i * t_chunk, lane="full") for i in range(3)]
    assert view.full_pending_s() == pytest.approx(0.1 * t_chunk)  # open loop: three chunks look nearly done
    view.reanchor()
    assert view.full_pending_s() == pytest.approx(3 * t_chunk)
    assert [c.pred_end for c in view.full] == pytest.approx([10.0 + (i + 1) * t_chunk for i in range(3)])
