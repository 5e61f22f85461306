"""`rose run --plot`: a PNG of the run's steps, from StepReports or a report's JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rose_core.app.jobs.step_report import StepReport
from rose_core.app.run.run_plot import plot_run
from rose_core.app.run.run_report import RunReport
from rose_core.support.errors import MissingExtraError


def steps() -> list[StepReport]:
    return [
        StepReport(
            step=n, weight_version=n, trajectories=8, turns_dedicated=6, turns_serving=2, reward_mean=0.1 * n,
            rollout_seconds=2.0, train_seconds=0.5, sync_seconds=0.25, sync_bytes=10, serving_requests=0,
            serving_ttft_p99_ms=0.0, serving_tpot_p99_ms=0.0, serving_slo_violations=0, success_rate=n / 5,
            eval_success=0.5 if n == 2 else None,
        )
        for n in range(5)
    ]


def test_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "run.png"
    plot_run(steps(), png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_from_the_report_json(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = RunReport()
    for s in steps():
        report.add(s)
    png = tmp_path / "from-json.png"
    plot_run(json.loads(json.dumps(report.to_dict()))["steps"], png)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_without_matplotlib_the_error_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'rose-core\[sim\]'"):
        plot_run(steps(), tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_no_steps_is_an_error_not_an_empty_picture(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one step"):
        plot_run([], tmp_path / "p.png")
