"""`rose bench e2e`'s systems as configs, and the figures of one run (pure)."""

from __future__ import annotations

import pytest

from rose_core.app.jobs.host_slo import HostSlo
from rose_core.app.jobs.step_report import StepReport
from rose_core.app.run.e2e_bench import format_e2e
from rose_core.app.run.e2e_systems import SYSTEMS, base_config, figures, ratios, system_config
from rose_core.app.run.run_report import RunReport

SLO = HostSlo(30.0, 8.0, "1.5 x serving alone's p99 over 50 production requests")


def test_each_system_is_the_same_job_with_one_thing_changed() -> None:
    base = base_config()
    configs = {s: system_config(base, s, SLO, 7, f"/tmp/e2e/{s}") for s in SYSTEMS}
    for system, config in configs.items():
        assert (config.rl.steps, config.run_dir, config.rl.seed) == (7, f"/tmp/e2e/{system}", base.rl.seed)
        assert (config.slo.from_alone, config.slo.ttft_ms, config.slo.tpot_ms) == (0.0, 30.0, 8.0)
        assert config.rl.prompts_per_step == base.rl.prompts_per_step == 6
        assert config.executors.serving_cores == "auto"
    assert configs["fixed"].scheduler.max_borrowed_workers == configs["fixed-async"].scheduler.max_borrowed_workers == 0
    assert (configs["fixed"].scheduler.staleness, configs["fixed-async"].scheduler.staleness) == (0, 1)
    assert configs["rose"].scheduler.max_borrowed_workers > 0 and configs["rose"].scheduler.staleness == 0
    assert configs["colocated"].executors.serving_overrides == {"slo": {"guard": False}, "rollout": {"nice": 0}}
    assert "guard" not in str(configs["rose"].executors.serving_overrides)
    with pytest.raises(ValueError, match="unknown system 'elastic'"):
        system_config(base, "elastic", SLO, 7, "/tmp")


def step(n: int, trajectories: int = 12, rollout: float = 1.0, serving: int = 0, reward: float = 0.0) -> StepReport:
    return StepReport(step=n, weight_version=n - 1, trajectories=trajectories, turns_dedicated=10,
                      turns_serving=serving, reward_mean=reward, rollout_seconds=rollout, train_seconds=0.5,
                      sync_seconds=0.1, sync_bytes=1, serving_requests=3, serving_ttft_p99_ms=20.0,
                      serving_tpot_p99_ms=5.0, serving_slo_violations=0)


def test_figures_leave_the_first_step_out_and_ratios_compare_to_the_fixed_systems() -> None:
    report = RunReport(serving_slo_judged=200, serving_slo_violations=1, serving_ttft_p99_ms=25.0)
    for n in range(1, 8):
        report.add(step(n, trajectories=99 if n == 1 else 12, rollout=1.5, serving=n, reward=n / 10))
    ends = [10.0 + 2.0 * i for i in range(7)]  # step 1 ends at 10 s, then one step every 2 s
    f = figures(report, ends)
    assert f["samples_per_s"] == pytest.approx(6 * 12 / 12.0)
    assert (f["step_s"], f["rollout_s_per_step"], f["rollout_share"]) == (2.0, 1.5, 0.75)
    assert f["slo_attainment"] == pytest.approx(0.995) and f["turns_serving"] == 28
    assert f["reward_last5"] == pytest.approx(0.5)
    assert ratios({"fixed": {"samples_per_s": 2.0}, "fixed-async": {"samples_per_s": 2.5},
                   "rose": {"samples_per_s": 3.0}}) == {"rose/fixed": 1.5, "rose/fixed-async": 1.2}
    result = {"slo": {"ttft_ms": 30.0, "tpot_ms": 8.0, "basis": SLO.basis}, "ratios": {"rose/fixed": 1.5},
              "systems": {"alone": {"slo_attainment": 1.0, "ttft_p99_ms": 20.0, "tpot_p99_ms": 5.0}, "rose": f}}
    table = format_e2e(result)
    assert "rose/fixed: 1.50x samples/s" in table and "0.995" in table and table.splitlines()[2].split()[1] == "-"
