"""Latency profiles: cache keys, cache round trip, SLO budgets derived from a profile, memory footprints."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from rose_core.config.executor_config import (
    ExecutorConfig,
    GuardSlo,
    MemorySection,
    RolloutSection,
    ServingSection,
    parse_executor_config,
)
from rose_core.policy import SloBudgets
from rose_executor.co_serving.co_serving import slo_budgets
from rose_executor.memory.serving_first_budget import footprint, memory_budget
from rose_executor.profile.latency_profile import EngineProfile, profile_key, read_cached, write_cached

PROFILE = EngineProfile(key="k", prefill_points=[(16, 0.006), (512, 0.018)], decode_points=[(1, 0.002), (8, 0.0023)])


def test_profile_key_names_model_dtype_and_device(policy_dir: Path, serving_dir: Path) -> None:
    key = profile_key(policy_dir, "bfloat16", "cpu-test")
    assert key.startswith("policy-bfloat16-cpu-test-")
    assert key == profile_key(policy_dir, "bfloat16", "cpu-test")
    assert key != profile_key(policy_dir, "float32", "cpu-test")
    assert profile_key(serving_dir, "bfloat16", "cpu-test") != key


def test_profile_cache_round_trip_and_stale_key(tmp_path: Path) -> None:
    path = tmp_path / "p" / "k.json"
    write_cached(path, PROFILE)
    assert read_cached(path, "k") == PROFILE
    assert read_cached(path, "another-model") is None
    path.write_text("{not json")
    assert read_cached(path, "k") is None


def test_slo_budgets_from_config_or_from_the_profile(policy_dir: Path) -> None:
    cfg = ExecutorConfig(rollout=RolloutSection(model_dir=str(policy_dir)), slo=GuardSlo(ttft_ms=500, tpot_ms=50))
    assert slo_budgets(cfg, PROFILE) == SloBudgets(0.5, 0.05)
    derived = slo_budgets(
        ExecutorConfig(rollout=RolloutSection(model_dir=str(policy_dir)), slo=GuardSlo(from_profile=5.0),
                       serving=ServingSection(max_num_seqs=8)), PROFILE
    )
    assert derived.ttft_s == pytest.approx(5 * 0.018) and derived.tpot_s == pytest.approx(5 * 0.0023)


def test_memory_budget_on_by_default_and_sized_from_the_models(policy_dir: Path, serving_dir: Path) -> None:
    policy = footprint(str(policy_dir), "bfloat16")
    assert policy.kv_bytes_per_token == 512 and policy.weight_bytes > 0
    serving = footprint(str(serving_dir), "bfloat16")
    base = ExecutorConfig(rollout=RolloutSection(model_dir=str(policy_dir)),
                          serving=ServingSection(model_dir=str(serving_dir)), kv_cache_gib=0.5)
    derived = memory_budget(base)  # the host share: both weights + both KV caches (0.5 GiB each)
    share = policy.weight_bytes + serving.weight_bytes + 2**30
    assert derived.policy.config.device_bytes == share
    assert derived.budget_bytes == share - int(0.2 * share) - policy.weight_bytes - serving.weight_bytes
    device = 4 * (policy.weight_bytes + serving.weight_bytes)
    text = (f'[rollout]\nmodel_dir = "{policy_dir}"\n[serving]\nmodel_dir = "{serving_dir}"\n'
            f"[memory]\ndevice_bytes = {device}\n")
    budget = memory_budget(parse_executor_config(text))
    assert budget is not None and not budget.frozen
    assert budget.budget_bytes == device - int(0.2 * device) - policy.weight_bytes - serving.weight_bytes


def test_guard_settings_are_validated(policy_dir: Path) -> None:
    with pytest.raises(ValueError, match="high_watermark"):
        MemorySection(high_watermark=0)
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        RolloutSection(model_dir=str(policy_dir), prefill_chunk_tokens=0)


def test_memory_budget_on_a_gpu_is_the_engines_memory_fractions(
    policy_dir: Path, serving_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rose_executor.host.device import Device, DeviceDescription
    from rose_executor.memory import serving_first_budget

    h200 = 150_000_000_000
    monkeypatch.setattr(serving_first_budget, "describe_device", lambda _d: DeviceDescription("cuda:0 (H200)", h200))
    config = ExecutorConfig(rollout=RolloutSection(model_dir=str(policy_dir)),
                            serving=ServingSection(model_dir=str(serving_dir)))
    budget = memory_budget(config, Device("cuda", 0))
    fractions = config.serving.memory_fraction + config.rollout.memory_fraction
    assert budget.policy.config.device_bytes == int(h200 * fractions)
    cpu = memory_budget(config)  # kv_cache_gib 0 on CPU: the engines' 1 GiB each
    assert cpu.policy.config.device_bytes > 2 * 2**30


def test_the_budget_is_what_the_engines_report_they_hold(policy_dir: Path, serving_dir: Path) -> None:
    """Once both engines run, the share is their weights plus the KV caches they report (vLLM's blocks x tokens
    per block, times the model's K and V bytes per token), whatever the config's fractions say; an explicit
    ``[memory] device_bytes`` still wins."""
    policy, serving = footprint(str(policy_dir), "bfloat16"), footprint(str(serving_dir), "bfloat16")
    config = ExecutorConfig(rollout=RolloutSection(model_dir=str(policy_dir)),
                            serving=ServingSection(model_dir=str(serving_dir)), kv_cache_gib=0.5)
    budget = memory_budget(config, kv_tokens=(40_000, 10_000))
    reported = (policy.weight_bytes + serving.weight_bytes + 40_000 * serving.kv_bytes_per_token
                + 10_000 * policy.kv_bytes_per_token)
    assert budget.policy.config.device_bytes == reported != memory_budget(config).policy.config.device_bytes
    pinned = msgspec.structs.replace(config, memory=MemorySection(device_bytes=4 * reported))
    assert memory_budget(pinned, kv_tokens=(40_000, 10_000)).policy.config.device_bytes == 4 * reported
