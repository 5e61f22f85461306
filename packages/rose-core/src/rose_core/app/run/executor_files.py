"""The `rose-executor --config` file `rose run` writes for each executor it starts: an ``ExecutorConfig`` (the
schema the executor reads, ``rose_core.config.executor_config``) built from the job's config, with the
job's `[executors] serving_overrides` / `dedicated_overrides` laid over it section by section."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from rose_core.app.config import RunConfig
from rose_core.config.executor_config import MOVED, ExecutorConfig, GuardSlo, RolloutSection, ServingSection
from rose_core.config.sections import dump_toml
from rose_core.support.errors import ConfigError


def executor_config(config: RunConfig, role: str, policy: Path, serving: Path) -> ExecutorConfig:
    """One local executor's config: the job's SLO (measured on production served alone with ``[slo]
    from_alone``: the job's report then judges by each host's measured numbers), KV cache and capacity, then
    that role's overrides."""
    ex, slo = config.executors, config.slo
    serving_role = role == "serving"
    base = ExecutorConfig(
        rollout=RolloutSection(model_dir=str(policy), capacity=ex.rollout_capacity),
        serving=ServingSection(model_dir=str(serving), host="127.0.0.1", port=0) if serving_role else ServingSection(),
        slo=GuardSlo(ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms, headroom_fraction=slo.headroom_fraction,
                     from_alone=slo.from_alone if config.load.enabled else 0.0,  # nothing to measure on
                     calibration_requests=slo.calibration_requests),
        kv_cache_gib=ex.kv_cache_gib, encrypt_control=config.controller.encrypt,
    )
    overrides = ex.serving_overrides if serving_role else ex.dedicated_overrides
    return with_overrides(base, overrides, f"executors.{role}_overrides")


def with_overrides(base: ExecutorConfig, overrides: Mapping[str, Any], where: str) -> ExecutorConfig:
    """``base`` with ``overrides`` (the executor config's own layout: sections as tables) laid over it; a
    ``ConfigError`` naming ``where`` and the field for anything the executor would refuse."""
    for old, new in MOVED.items():
        if old in overrides:
            raise ConfigError(f"{where}: `{old}` has moved: write it as `{new}` (a table per section)")
    merged = _merge(msgspec.to_builtins(base), overrides)
    try:
        return msgspec.convert(merged, ExecutorConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc} (docs/executor.md lists the executor's settings)") from exc


def write_executor_config(path: Path, config: ExecutorConfig) -> None:
    path.write_text(dump_toml(config))


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out
