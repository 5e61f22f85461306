"""GRPO: group-normalized advantages, and the samples they turn into. Pure and torch-free."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rose_core.rl.sample import TrainSample
from rose_core.rl.trajectory import Trajectory

DEFAULT_EPS = 1e-6


def normalize_group(rewards: Sequence[float], eps: float = DEFAULT_EPS) -> list[float]:
    """``(r - mean) / (std + eps)`` with the population std; a group whose rewards are all equal gets zeros."""
    if eps <= 0.0:
        raise ValueError(f"eps {eps} must be positive")
    if any(not math.isfinite(r) for r in rewards):
        raise ValueError("rewards must be finite: check the environment's reward function")
    if not rewards or max(rewards) == min(rewards):
        return [0.0] * len(rewards)
    mean = math.fsum(rewards) / len(rewards)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def group_advantages(trajectories: Sequence[Trajectory], eps: float = DEFAULT_EPS) -> dict[str, float]:
    """Trajectory id -> its advantage within its group (trajectories sharing ``group_id``)."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    advantages: dict[str, float] = {}
    for members in groups.values():
        normalized = normalize_group([t.total_reward for t in members], eps)
        for trajectory, advantage in zip(members, normalized, strict=True):
            if trajectory.trajectory_id in advantages:
                raise ValueError(f"trajectory id {trajectory.trajectory_id!r} appears twice: ids must be unique")
            advantages[trajectory.trajectory_id] = advantage
    return advantages


def build_samples(
    trajectories: Sequence[Trajectory], eps: float = DEFAULT_EPS, *, skip_zero_advantage: bool = False
) -> list[TrainSample]:
    """One sample per turn, carrying its trajectory's group-normalized advantage."""
    advantages = group_advantages(trajectories, eps)
    samples = []
    for trajectory in trajectories:
        advantage = advantages[trajectory.trajectory_id]
        if skip_zero_advantage and advantage == 0.0:
            continue
        for index, turn in enumerate(trajectory.turns):
            samples.append(
                TrainSample(
                    trajectory_id=trajectory.trajectory_id,
                    turn_index=index,
                    prompt_token_ids=turn.prompt_token_ids,
                    response_token_ids=turn.response_token_ids,
                    behaviour_logprobs=turn.behaviour_logprobs,
                    weight_version=turn.weight_version,
                    advantage=advantage,
                )
            )
    return samples
