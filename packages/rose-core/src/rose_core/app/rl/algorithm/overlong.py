"""DAPO's soft overlong punishment: a reward shaping that is a pure function of a response's length.

ROSE applies it per turn (each LLM call has its own budget, ``rl.max_tokens_per_turn``, and a turn that hits it
was cut off): every turn's shaping is added to its trajectory's reward, as the turns' own rewards are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rose_core.app.config import RLConfig
from rose_core.app.rl.algorithm.trajectory import Trajectory


def overlong_shaping(length: int, max_length: int, buffer: int, penalty: float) -> float:
    """The reward added to a response of ``length`` tokens under a budget of ``max_length``: 0 up to
    ``max_length - buffer``, then falling linearly to ``-penalty`` at ``max_length`` (and ``-penalty`` past it);
    ``buffer`` 0 turns it off. DAPO (Yu et al. 2025, eq. 13), with ``penalty`` scaling it."""
    _check(max_length, buffer, penalty)
    if length < 0:
        raise ValueError(f"length {length} must be >= 0: pass the response's token count")
    if buffer == 0:
        return 0.0
    free = max_length - buffer
    if length <= free:
        return 0.0
    if length >= max_length:
        return -penalty
    return (free - length) / buffer * penalty


@dataclass(slots=True, frozen=True)
class OverlongShaping:
    """``overlong_shaping`` with its budget fixed: ``max_length`` is the per-turn token budget."""

    max_length: int
    buffer: int
    penalty: float = 1.0

    def __post_init__(self) -> None:
        _check(self.max_length, self.buffer, self.penalty)

    @classmethod
    def from_config(cls, rl: RLConfig) -> OverlongShaping:
        return cls(rl.max_tokens_per_turn, rl.loss.overlong_buffer_tokens, rl.loss.overlong_penalty)

    def shaped_reward(self, trajectory: Trajectory) -> float:
        """The trajectory's reward plus every turn's shaping."""
        shaping = (overlong_shaping(len(t.response_token_ids), self.max_length, self.buffer, self.penalty)
                   for t in trajectory.turns)
        return trajectory.total_reward + math.fsum(shaping)


def _check(max_length: int, buffer: int, penalty: float) -> None:
    if max_length < 1:
        raise ValueError(f"max_length {max_length} must be >= 1: pass the turn's token budget")
    if not 0 <= buffer <= max_length:
        raise ValueError(f"overlong buffer {buffer} must be in 0..max_length ({max_length})")
    if not (math.isfinite(penalty) and penalty >= 0.0):
        raise ValueError(f"overlong penalty {penalty} must be finite and >= 0")
