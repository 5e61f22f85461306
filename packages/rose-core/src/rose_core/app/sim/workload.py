"""RL trajectories of one training step: turns, tokens per turn with long tails, DAPO over-sampling."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rose_core.app.sim.scenario import Algorithm, WorkloadSpec


@dataclass(slots=True)
class Trajectory:
    trajectory_id: str
    batch: int
    decode_tokens: list[int]
    context_tokens: int
    think_s: list[float]
    """Environment time after each turn (pre-drawn, so every system sees the same workload)."""
    turn: int = 0
    last_worker: str = ""
    tokens_total: int = 0
    done_at: float = -1.0

    @property
    def turns(self) -> int:
        return len(self.decode_tokens)


def dapo_keep_fraction(spec: WorkloadSpec, step: int) -> float:
    """Share of groups with mixed rewards at ``step``: falls from first to last as the policy improves."""
    if spec.steps == 1:
        return spec.dapo_keep_first
    x = step / (spec.steps - 1)
    return spec.dapo_keep_first + (spec.dapo_keep_last - spec.dapo_keep_first) * x


def groups_launched(spec: WorkloadSpec, algorithm: Algorithm, step: int) -> int:
    """GRPO launches batch / group_size groups; DAPO over-launches to fill the batch with kept groups."""
    needed = spec.batch // spec.group_size
    if algorithm == "grpo":
        return needed
    return math.ceil(needed / dapo_keep_fraction(spec, step))


def sample_batch(seed: int, spec: WorkloadSpec, algorithm: Algorithm, batch: int) -> list[Trajectory]:
    """The trajectories of one step; the same for every system (seeded by scenario seed, algorithm, step)."""
    rng = np.random.default_rng([seed, 0 if algorithm == "grpo" else 1, batch])
    n = groups_launched(spec, algorithm, batch) * spec.group_size
    sigma_turns = 0.6
    turns = np.clip(np.rint(rng.lognormal(math.log(spec.turns_mean) - sigma_turns**2 / 2, sigma_turns, n)),
                    1, spec.max_turns).astype(int)
    out = []
    for i in range(n):
        decode = np.clip(rng.lognormal(math.log(spec.decode_tokens_median), spec.decode_tokens_sigma, turns[i]),
                         16, spec.max_decode_tokens).astype(int)
        think = rng.exponential(spec.think_time_mean_s, turns[i])
        out.append(Trajectory(f"b{batch}.{i}", batch, [int(d) for d in decode], spec.prompt_tokens,
                              [float(t) for t in think]))
    return out
