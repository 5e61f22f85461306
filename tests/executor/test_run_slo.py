"""`rose run`'s serving executors derive their SLO budgets from the start-up profile (the embedded demo)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from rose_core.config import RunConfig
from rose_core.run.rose_run import DEMO_SLO_FROM_PROFILE, executor_config
from rose_executor.co_serving.co_serving import slo_budgets
from rose_executor.config import parse_executor_config
from rose_executor.engine.latency_profile import EngineProfile

PROFILE = EngineProfile(
    key="p", prefill_points=[(16, 0.004), (128, 0.006), (512, 0.020)], decode_points=[(1, 0.002), (8, 0.003)]
)


def test_serving_executors_of_rose_run_take_their_slo_from_the_profile(policy_dir: Path, serving_dir: Path) -> None:
    run = RunConfig()
    serving = parse_executor_config(tomli_w.dumps(executor_config(run, "serving", policy_dir, serving_dir, 0)))
    assert serving.slo_from_profile == DEMO_SLO_FROM_PROFILE > 0
    budgets = slo_budgets(serving, PROFILE)
    model = PROFILE.latency_model()
    assert budgets.ttft_s == pytest.approx(DEMO_SLO_FROM_PROFILE * model.prefill_s(512, serving.prefill_chunk_tokens))
    assert budgets.tpot_s == pytest.approx(DEMO_SLO_FROM_PROFILE * model.decode_step_s(serving.serving_max_num_seqs))
    assert budgets.ttft_s * 1e3 != run.slo.ttft_ms  # not the fixed [slo] values any more
    dedicated = parse_executor_config(tomli_w.dumps(executor_config(run, "dedicated", policy_dir, serving_dir, 0)))
    assert dedicated.slo_from_profile == 0  # no guard on a dedicated host
