"""GRPO advantages (optionally Dr. GRPO's, without the std), the samples they turn into, and DAPO's dynamic
sampling filter. Pure and torch-free."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rose_core.app.config import RLConfig
from rose_core.app.rl.algorithm.overlong import OverlongShaping
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory import Trajectory

DEFAULT_EPS = 1e-6


def normalize_group(rewards: Sequence[float], eps: float = DEFAULT_EPS, *, std_norm: bool = True) -> list[float]:
    """``(r - mean) / (std + eps)`` with the population std, or ``r - mean`` without ``std_norm`` (Dr. GRPO);
    a group whose rewards are all equal gets zeros."""
    if eps <= 0.0:
        raise ValueError(f"eps {eps} must be positive")
    if any(not math.isfinite(r) for r in rewards):
        raise ValueError("rewards must be finite: check the environment's reward function")
    if not rewards or max(rewards) == min(rewards):
        return [0.0] * len(rewards)
    mean = math.fsum(rewards) / len(rewards)
    if not std_norm:
        return [r - mean for r in rewards]
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def group_advantages(
    trajectories: Sequence[Trajectory],
    eps: float = DEFAULT_EPS,
    *,
    std_norm: bool = True,
    overlong: OverlongShaping | None = None,
) -> dict[str, float]:
    """Trajectory id -> its advantage within its group (trajectories sharing ``group_id``), from its reward
    (plus its turns' overlong shaping when ``overlong`` is given)."""
    advantages: dict[str, float] = {}
    for members in _groups(trajectories).values():
        rewards = [t.total_reward if overlong is None else overlong.shaped_reward(t) for t in members]
        for trajectory, advantage in zip(members, normalize_group(rewards, eps, std_norm=std_norm), strict=True):
            if trajectory.trajectory_id in advantages:
                raise ValueError(f"trajectory id {trajectory.trajectory_id!r} appears twice: ids must be unique")
            advantages[trajectory.trajectory_id] = advantage
    return advantages


def build_samples(
    trajectories: Sequence[Trajectory],
    eps: float = DEFAULT_EPS,
    *,
    skip_zero_advantage: bool = False,
    std_norm: bool = True,
    overlong: OverlongShaping | None = None,
) -> list[TrainSample]:
    """One sample per turn, carrying its trajectory's group-normalized advantage."""
    advantages = group_advantages(trajectories, eps, std_norm=std_norm, overlong=overlong)
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
                    temperature=turn.temperature,
                    top_p=turn.top_p,
                )
            )
    return samples


def build_samples_from_config(trajectories: Sequence[Trajectory], rl: RLConfig) -> list[TrainSample]:
    """``build_samples`` with the job's ``advantage_std_norm`` and overlong shaping (off at buffer 0)."""
    overlong = OverlongShaping.from_config(rl) if rl.loss.overlong_buffer_tokens > 0 else None
    return build_samples(trajectories, std_norm=rl.loss.advantage_std_norm, overlong=overlong)


def informative_groups(trajectories: Sequence[Trajectory]) -> tuple[list[Trajectory], list[str]]:
    """DAPO's dynamic sampling filter: (the trajectories of groups whose rewards differ, in their order; the
    ids of the groups dropped because every member got the same reward, in first-seen order). A dropped group
    has zero advantage everywhere and so no gradient. Uses the environment's ``total_reward`` (before overlong
    shaping: the filter is on what was achieved, not on length); a group of one is dropped."""
    groups = _groups(trajectories)
    dropped = [gid for gid, members in groups.items() if _constant([t.total_reward for t in members])]
    gone = set(dropped)
    return [t for t in trajectories if t.group_id not in gone], dropped


def _groups(trajectories: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    return groups


def _constant(rewards: Sequence[float]) -> bool:
    return max(rewards) == min(rewards)
