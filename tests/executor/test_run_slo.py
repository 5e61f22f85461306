"""`rose run`'s serving executors derive their SLO budgets from the start-up profile (the embedded demo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rose_core.app.config import RunConfig
from rose_core.app.run.executor_files import DEMO_SLO_FROM_PROFILE, executor_config
from rose_core.config.executor_config import parse_executor_config
from rose_core.config.sections import dump_toml
from rose_executor.co_serving.co_serving import slo_budgets
from rose_executor.profile.latency_profile import EngineProfile

PROFILE = EngineProfile(
    key="p", prefill_points=[(16, 0.004), (128, 0.006), (512, 0.020)], decode_points=[(1, 0.002), (8, 0.003)]
)


def test_serving_executors_of_rose_run_take_their_slo_from_the_profile(policy_dir: Path, serving_dir: Path) -> None:
    run = RunConfig()
    serving = parse_executor_config(dump_toml(executor_config(run, "serving", policy_dir, serving_dir)))
    assert serving.slo.from_profile == DEMO_SLO_FROM_PROFILE > 0
    budgets = slo_budgets(serving, PROFILE)
    model = PROFILE.latency_model()
    assert budgets.ttft_s == pytest.approx(DEMO_SLO_FROM_PROFILE * model.prefill_s(512, serving.rollout.prefill_chunk_tokens))
    assert budgets.tpot_s == pytest.approx(DEMO_SLO_FROM_PROFILE * model.decode_step_s(serving.serving.max_num_seqs))
    assert budgets.ttft_s * 1e3 != run.slo.ttft_ms  # not the fixed [slo] values any more
    dedicated = parse_executor_config(dump_toml(executor_config(run, "dedicated", policy_dir, serving_dir)))
    assert dedicated.slo.from_profile == 0  # no guard on a dedicated host


def test_a_ttft_budget_below_the_guards_floor_is_reported_with_its_fix(
    caplog: pytest.LogCaptureFixture, policy_dir: Path, serving_dir: Path
) -> None:
    """The executor publishes the tightest TTFT budget co-location can keep (the longest profiled prompt's
    prefill + the rollout step a hold cannot stop + the margin) and warns, naming the settings to change, when
    its budget is below it; a budget above it passes quietly."""
    from rose_core.policy import CoServingGuard
    from rose_executor import metrics
    from rose_executor.co_serving.co_serving import check_ttft_floor, guard_settings

    serving = parse_executor_config(dump_toml(executor_config(RunConfig(), "serving", policy_dir, serving_dir)))
    rollout = EngineProfile(key="r", prefill_points=[(16, 0.003), (512, 0.015)], decode_points=[(1, 0.002), (16, 0.006)])
    slo = slo_budgets(serving, PROFILE)
    guard = CoServingGuard.build(guard_settings(serving, slo), PROFILE.latency_model(), rollout.latency_model())
    expected = guard.ttft_floor_s(512)
    assert expected > PROFILE.latency_model().prefill_s(512, serving.rollout.prefill_chunk_tokens)
    with caplog.at_level("WARNING", logger="rose_executor.co_serving.co_serving"):
        assert check_ttft_floor(guard, type(slo)(expected * 0.8, slo.tpot_s), 512) == pytest.approx(expected)
    assert metrics.GUARD_TTFT_FLOOR._value.get() == pytest.approx(expected)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "below what co-location can keep" in warning and "Raise [slo] ttft_ms" in warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="rose_executor.co_serving.co_serving"):
        check_ttft_floor(guard, type(slo)(expected * 1.2, slo.tpot_s), 512)
    assert not caplog.records
