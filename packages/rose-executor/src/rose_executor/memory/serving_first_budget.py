"""The mechanism of serving-first memory on this device: observations for ``ServingFirstMemory``.

Always on for a serving host. The device share is ``[memory] device_bytes`` when set, else derived
(``host_share``): on CPU what this host gave the two engines, both models' weights plus both KV caches
(``kv_cache_gib`` each, 1 GiB when 0); on GPU the two engines' memory fractions of the devices they use.

On CPU vLLM can neither resize nor sleep its KV cache, so the budget is enforced by admission: a rollout
sequence counts ``(prompt + max_tokens) x kv_bytes_per_token`` of the policy model from the moment it is
admitted, and serving counts its weights plus the same reservation for each in-flight serving request (an
upper bound of what its KV pages can reach; vLLM's ``kv_cache_usage`` ratio of a preallocated cache would
not show growth). The pure policy decides budget, cut, aborts and freeze.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rose_core.config.executor_config import ExecutorConfig
from rose_core.policy import LiveRequest, MemoryDecision, MemoryPolicyConfig, RolloutMemoryUse, ServingFirstMemory
from rose_executor import metrics
from rose_executor.engine.engine_settings import CPU_KV_CACHE_GIB
from rose_executor.host.device import Device, describe_device
from rose_executor.profile.model_info import count_parameters, dtype_bytes, kv_bytes_per_token_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    weight_bytes: int
    kv_bytes_per_token: int

    def __post_init__(self) -> None:
        if self.weight_bytes < 0 or self.kv_bytes_per_token < 0:
            raise ValueError("model footprint bytes must be >= 0")


class ServingFirstBudget:
    """Feeds the pure ``ServingFirstMemory`` policy and remembers its last decision."""

    def __init__(self, config: MemoryPolicyConfig, serving: ModelFootprint, rollout: ModelFootprint) -> None:
        if config.rollout_weight_bytes != rollout.weight_bytes:
            raise ValueError("MemoryPolicyConfig.rollout_weight_bytes must be the rollout model's weight bytes")
        self.serving = serving
        self.rollout = rollout
        self.policy = ServingFirstMemory(config, serving.weight_bytes)
        metrics.ROLLOUT_BUDGET_BYTES.set(self.policy.budget_bytes)

    @property
    def frozen(self) -> bool:
        return self.policy.frozen

    @property
    def budget_bytes(self) -> int:
        return self.policy.budget_bytes

    def rollout_bytes(self, prompt_tokens: int, max_tokens: int) -> int:
        return (prompt_tokens + max_tokens) * self.rollout.kv_bytes_per_token

    def serving_bytes(self, serving: Sequence[LiveRequest]) -> int:
        reserved = sum(r.reserved_tokens for r in serving)
        return self.serving.weight_bytes + reserved * self.serving.kv_bytes_per_token

    def fits(self, used_bytes: int, extra_bytes: int) -> bool:
        return self.policy.fits(used_bytes, extra_bytes)

    def observe(
        self, now: float, serving: Sequence[LiveRequest], rollout: Sequence[RolloutMemoryUse]
    ) -> MemoryDecision:
        decision = self.policy.observe(now, self.serving_bytes(serving), rollout)
        if decision.cut:
            metrics.ROLLOUT_BUDGET_CUTS.inc()
            metrics.ROLLOUT_BUDGET_BYTES.set(decision.budget_bytes)
        metrics.ROLLOUT_BUDGET_FROZEN.set(1 if decision.frozen else 0)
        return decision

    def on_step(self, step: int, serving: Sequence[LiveRequest]) -> bool:
        """RL step boundary: unfreeze and re-budget; False (nothing changes) for a step already seen."""
        if step <= self.policy.step:
            return False
        self.policy.on_step(step, self.serving_bytes(serving))
        metrics.ROLLOUT_BUDGET_BYTES.set(self.policy.budget_bytes)
        metrics.ROLLOUT_BUDGET_FROZEN.set(0)
        return True


def memory_budget(config: ExecutorConfig, device: Device | None = None, kv_tokens: tuple[int, int] = (0, 0),
                  rollout_model_dir: str = "") -> ServingFirstBudget:
    """The serving-first budget of this serving host: ``[memory] device_bytes``, else what the two engines hold
    as they report it (weights plus ``kv_tokens``, serving's and rollout's KV caches in tokens, from vLLM's
    blocks), else the share of ``device`` (the CPU when None) derived from the config."""
    serving = footprint(config.serving.model_dir, config.dtype)
    rollout = footprint(rollout_model_dir or config.rollout.model_dir, config.dtype)
    reported = serving.weight_bytes + rollout.weight_bytes + engines_kv_bytes(serving, rollout, kv_tokens)
    share = config.memory.device_bytes or (reported if all(kv_tokens) else serving_host_bytes(config, device or Device("cpu")))
    where = ("[memory] device_bytes" if config.memory.device_bytes
             else "the engines' weights and reported KV caches" if all(kv_tokens) else "derived from the engines' shares")
    log.info("serving-first memory: %.1f MB for serving + rollout (%s); budget enforced by admission",
             share / 1e6, where)
    policy = MemoryPolicyConfig(
        device_bytes=share,
        rollout_weight_bytes=rollout.weight_bytes,
        headroom_fraction=config.memory.headroom_fraction,
        high_watermark=config.memory.high_watermark,
    )
    return ServingFirstBudget(policy, serving, rollout)


def engines_kv_bytes(serving: ModelFootprint, rollout: ModelFootprint, kv_tokens: tuple[int, int]) -> int:
    """The bytes of the two engines' KV caches, from the tokens they report."""
    return serving.kv_bytes_per_token * kv_tokens[0] + rollout.kv_bytes_per_token * kv_tokens[1]


def host_share(config: ExecutorConfig, serving: ModelFootprint, rollout: ModelFootprint, device: Device) -> int:
    """What this host gave the two engines: on GPU their memory fractions of the devices they use; on CPU both
    models' weights and both KV caches."""
    if device.on_gpu:
        fractions = config.serving.memory_fraction + config.rollout.memory_fraction
        return int(describe_device(device).memory_bytes * fractions)
    kv_gib = config.kv_cache_gib or CPU_KV_CACHE_GIB
    return serving.weight_bytes + rollout.weight_bytes + 2 * int(kv_gib * 2**30)


def rollout_engine_bytes(config: ExecutorConfig, device: Device, model_dir: str) -> int:
    """What a rollout engine on ``model_dir`` is given: on GPU its memory fraction of the devices, on CPU its
    weights and its KV cache."""
    if device.on_gpu:
        return int(describe_device(device).memory_bytes * config.rollout.memory_fraction)
    kv_gib = config.kv_cache_gib or CPU_KV_CACHE_GIB
    return footprint(model_dir, config.dtype).weight_bytes + int(kv_gib * 2**30)


def serving_host_bytes(config: ExecutorConfig, device: Device) -> int:
    """A serving host's share for both engines (``[memory] device_bytes``, or derived: ``host_share``)."""
    serving = footprint(config.serving.model_dir, config.dtype)
    rollout = footprint(config.rollout.model_dir, config.dtype)
    return config.memory.device_bytes or host_share(config, serving, rollout, device)


def footprint(model_dir: str, dtype: str) -> ModelFootprint:
    root = Path(model_dir)
    return ModelFootprint(count_parameters(root) * dtype_bytes(dtype), kv_bytes_per_token_of(root))
