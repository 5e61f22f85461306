"""The `rose run` report: each step's ``sync_breakdown`` in the JSON, the summary line of its medians."""

from __future__ import annotations

import json

from rose_core.app.controller.weight_sync import ExecutorSync, SyncBreakdown
from rose_core.app.jobs.step_report import StepReport
from rose_core.app.run.run_report import RunReport, format_table, sync_summary


def step(n: int, sync_s: float, wait_s: float) -> StepReport:
    part = ExecutorSync(bytes_received=10, elapsed_s=sync_s - 0.1, transfer_s=0.05, apply_s=sync_s - 0.15 - wait_s,
                        wait_s=wait_s, commit_s=0.01, digest_ok=n != 1)
    breakdown = SyncBreakdown.of({"d": part}, publish_s=0.1, export_s=0.02, announce_s=sync_s - 0.1)
    return StepReport(
        step=n, weight_version=n, trajectories=4, turns_dedicated=3, turns_serving=1, reward_mean=0.5,
        rollout_seconds=2.0, train_seconds=0.3, sync_seconds=sync_s, sync_bytes=10, serving_requests=2,
        serving_ttft_p99_ms=30.0, serving_tpot_p99_ms=5.0, serving_slo_violations=0, sync_breakdown=breakdown,
    )


def test_each_step_carries_its_sync_breakdown_in_the_json() -> None:
    report = RunReport()
    report.add(step(0, 1.0, 0.4))
    data = json.loads(json.dumps(report.to_dict()))
    sync = data["steps"][0]["sync_breakdown"]
    assert sync["publish_s"] == 0.1 and sync["export_s"] == 0.02 and sync["last"] == "d"
    assert sync["executors"]["d"]["wait_s"] == 0.4 and sync["executors"]["d"]["commit_s"] == 0.01
    assert set(sync["executors"]["d"]) >= {"bytes_received", "transfer_s", "apply_s", "wait_s", "commit_s",
                                           "retransform_s", "drain_s", "digest_ok", "full_sync"}
    assert sync["digest_mismatches"] == 0 and data["weight_digest_mismatches"] == 0 and report.ok
    assert data["steps"][0]["sync_seconds"] == 1.0  # unchanged beside it


def test_summary_names_the_median_of_each_part() -> None:
    steps = [step(0, 1.0, 0.4), step(1, 2.0, 0.6), step(2, 3.0, 0.8)]
    line = sync_summary(steps)
    assert line.startswith("weight sync median 2.00 s: publish 0.10 · transfer 0.05 · apply 1.25 · wait 0.60")
    assert sync_summary([]) == ""
    assert "sync s" in format_table(steps)  # the table keeps its one sync column


def test_an_engine_holding_other_weights_than_the_trainer_fails_the_run() -> None:
    report = RunReport()
    report.add(step(0, 1.0, 0.4))
    report.add(step(1, 1.0, 0.4))  # its engine's digest differs from the announced one
    assert report.weight_digest_mismatches == 1
    assert not report.ok
