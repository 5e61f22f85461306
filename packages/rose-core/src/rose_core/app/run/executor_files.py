"""The `rose-executor --config` file `rose run` writes for each executor it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rose_core.app.config import RunConfig

DEMO_SLO_FROM_PROFILE = 10.0
"""The embedded demo's serving SLO: a serving executor derives its TTFT / TPOT budgets from its start-up
profile, as this multiple of the serving-alone latency (prefill of a 512-token prompt; decode step at the full
serving batch); `[slo]` ttft_ms / tpot_ms then only judge the client-side latency in the run report."""


def executor_config(config: RunConfig, role: str, policy: Path, serving: Path, index: int) -> dict[str, Any]:
    """The `rose-executor --config` file for one local executor (its schema: rose_executor.config)."""
    ex = config.executors
    section: dict[str, Any] = {
        "policy_model_dir": str(policy),
        "kv_cache_gib": ex.kv_cache_gib,
        "rollout_capacity": ex.rollout_capacity,
        "slo_ttft_ms": config.slo.ttft_ms,
        "slo_tpot_ms": config.slo.tpot_ms,
        "headroom_fraction": config.slo.headroom_fraction,
        "encrypt_control": config.controller.encrypt,
    }
    if role == "serving":
        section.update(
            serving_model_dir=str(serving),
            serving_host="127.0.0.1",
            serving_port=0,
            slo_from_profile=DEMO_SLO_FROM_PROFILE,
        )
    section.update(ex.serving_overrides if role == "serving" else ex.dedicated_overrides)
    return section
