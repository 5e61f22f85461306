"""`rose bench e2e` tiny (2 steps per system), as a user runs it: the report's shape, and each system ran as
named: no turn on the serving host without borrowing, the guard off only in ``colocated``, one SLO measured on
serving alone and used by every system. Nothing timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rose_core.app.run.e2e_systems import SYSTEMS

CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[rl]
prompts_per_step = 2
group_size = 2
max_turns = 2
max_tokens_per_turn = 8
eval.every = 0

[slo]
calibration_requests = 15

[load]
base_rps = 4.0
burst_rps = 8.0
"""
KEYS = ("samples_per_s", "rollout_s_per_step", "slo_attainment", "ttft_p99_ms", "tpot_p99_ms", "turns_serving",
        "reward_last5")


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, subprocess.CompletedProcess[str]]:
    work = tmp_path_factory.mktemp("e2e")
    config = work / "bench.toml"
    config.write_text(CONFIG.format(work=work))
    done = subprocess.run([sys.executable, "-m", "rose_core", "bench", "e2e", "--steps", "2", "--alone-s", "3",
                           "--config", str(config), "--json"], check=False, capture_output=True, text=True,
                          timeout=1500)
    assert done.returncode == 0, done.stderr[-5000:]
    return json.loads(done.stdout), work / "run", done


def test_every_system_reports_the_figures_the_paper_compares(bench: tuple[dict, Path, object]) -> None:
    result, _, _ = bench
    assert list(result["systems"]) == ["alone", *SYSTEMS]
    for name in SYSTEMS:
        figures = result["systems"][name]
        assert figures["ok"] and figures["steps"] == 2, (name, figures["error"])
        assert all(key in figures for key in KEYS), name
        assert figures["samples_per_s"] > 0 and 0.0 <= figures["slo_attainment"] <= 1.0
    alone = result["systems"]["alone"]
    assert alone["turns_serving"] == 0 and alone["slo_judged"] > 0
    assert set(result["ratios"]) == {"rose/fixed", "rose/fixed-async"}
    assert "serving hosts on" in result["cores"]


def test_every_run_splits_the_same_cores(bench: tuple[dict, Path, subprocess.CompletedProcess[str]]) -> None:
    """Each run gives the cores back when it ends: the next one splits them again (not the job's half of them)."""
    result, _, done = bench
    assert done.stderr.count(f"cores: {result['cores'].removeprefix('cores: ')}") == 1 + len(SYSTEMS)


def test_one_slo_measured_on_serving_alone_judges_every_system(bench: tuple[dict, Path, object]) -> None:
    result, run_dir, _ = bench
    slo = result["slo"]
    assert "1.5 x serving alone's p99 over 15 production requests" in slo["basis"]
    for name in SYSTEMS:
        log = (run_dir / name / "logs" / "executor-serving-0.log").read_text()
        assert f"SLO guard: TTFT budget {slo['ttft_ms']:.1f} ms, TPOT budget {slo['tpot_ms']:.1f} ms" in log, name


def test_each_system_ran_as_named(bench: tuple[dict, Path, object]) -> None:
    result, run_dir, _ = bench
    for name in ("fixed", "fixed-async"):  # no borrowing: nothing ran on the serving host
        assert result["systems"][name]["turns_serving"] == 0, name
    logs = {name: (run_dir / name / "logs" / "executor-serving-0.log").read_text() for name in SYSTEMS}
    assert "[slo] guard = false" in logs["colocated"]
    assert all("[slo] guard = false" not in logs[name] for name in ("fixed", "fixed-async", "rose"))
    configs = {name: (run_dir / name / "executor-serving-0.toml").read_text() for name in SYSTEMS}
    assert "guard = false" in configs["colocated"] and "guard = false" not in configs["rose"]
