"""Serving-first memory sharing on a borrowed serving GPU (paper-notes 2.1(b)).

One device budget holds the serving model's usage (weights + KV) and the rollout KV budget. A headroom
(default 20% of device memory) is kept for serving above its usage at the last RL step boundary. When serving
usage crosses the high watermark inside that headroom: ONE emergency cut of the rollout budget by
``cut_factor`` (2x), the rollout requests that no longer fit are aborted (youngest first), and the budget is
frozen until ``on_step``. While frozen nothing changes, so the budget never oscillates inside a step.
Pure: ``now`` and observations in, decisions out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class MemoryPolicyConfig:
    device_bytes: int
    rollout_weight_bytes: int = 0
    """The (inactive, pre-deployed) rollout model's resident bytes: never part of the KV budget."""
    headroom_fraction: float = 0.2
    high_watermark: float = 0.5
    """Fraction of the headroom serving may consume before the emergency cut."""
    cut_factor: float = 2.0

    def __post_init__(self) -> None:
        if self.device_bytes <= 0:
            raise ValueError(f"`device_bytes` must be > 0 (got {self.device_bytes})")
        if not 0 <= self.rollout_weight_bytes < self.device_bytes:
            raise ValueError("`rollout_weight_bytes` must be in [0, device_bytes)")
        if not 0 < self.headroom_fraction < 1:
            raise ValueError(f"`headroom_fraction` must be in (0, 1) (got {self.headroom_fraction})")
        if not 0 < self.high_watermark <= 1:
            raise ValueError(f"`high_watermark` must be in (0, 1] (got {self.high_watermark})")
        if not self.cut_factor > 1:
            raise ValueError(f"`cut_factor` must be > 1 (got {self.cut_factor})")

    @property
    def headroom_bytes(self) -> int:
        return int(self.device_bytes * self.headroom_fraction)


@dataclass(slots=True, frozen=True)
class RolloutMemoryUse:
    request_id: str
    kv_bytes: int
    started_at: float


@dataclass(slots=True, frozen=True)
class MemoryDecision:
    budget_bytes: int
    frozen: bool
    cut: bool
    """True only on the observation that triggered the emergency cut."""
    abort: tuple[str, ...] = ()


class ServingFirstMemory:
    def __init__(self, config: MemoryPolicyConfig, serving_bytes: int = 0) -> None:
        self.config = config
        self.budget_bytes = 0
        self.frozen = False
        self.step = -1
        self.cuts = 0
        self._serving_limit = 0
        self._rebudget(serving_bytes)

    @property
    def serving_limit_bytes(self) -> int:
        """Serving usage at or above which the next observation cuts (the high watermark)."""
        return self._serving_limit

    def on_step(self, step: int, serving_bytes: int) -> int:
        """RL step boundary: unfreeze and recompute the budget from current serving usage."""
        if step <= self.step:
            raise ValueError(f"steps must increase (got {step} after {self.step})")
        self.step = step
        self.frozen = False
        return self._rebudget(serving_bytes)

    def fits(self, used_bytes: int, extra_bytes: int) -> bool:
        """May a rollout request of ``extra_bytes`` start when rollout already holds ``used_bytes``?"""
        return used_bytes + extra_bytes <= self.budget_bytes

    def observe(self, now: float, serving_bytes: int, rollout: Sequence[RolloutMemoryUse]) -> MemoryDecision:
        """A serving usage sample. Crossing the high watermark (unfrozen) cuts once and names the aborts."""
        if self.frozen or serving_bytes < self._serving_limit:
            return MemoryDecision(self.budget_bytes, self.frozen, False)
        self.budget_bytes = int(self.budget_bytes / self.config.cut_factor)
        self.frozen = True
        self.cuts += 1
        return MemoryDecision(self.budget_bytes, True, True, self._victims(rollout))

    def _victims(self, rollout: Sequence[RolloutMemoryUse]) -> tuple[str, ...]:
        """Youngest first, until what remains fits the cut budget."""
        used = sum(r.kv_bytes for r in rollout)
        victims: list[str] = []
        for r in sorted(rollout, key=lambda r: (-r.started_at, r.request_id)):
            if used <= self.budget_bytes:
                break
            victims.append(r.request_id)
            used -= r.kv_bytes
        return tuple(victims)

    def _rebudget(self, serving_bytes: int) -> int:
        cfg = self.config
        free = cfg.device_bytes - cfg.rollout_weight_bytes - max(0, serving_bytes) - cfg.headroom_bytes
        self.budget_bytes = max(0, free)
        serving_room = cfg.device_bytes - cfg.rollout_weight_bytes - self.budget_bytes
        self._serving_limit = serving_room - int(cfg.headroom_bytes * (1 - cfg.high_watermark))
        return self.budget_bytes
