"""One training sample: a turn of a trajectory with the advantage of that trajectory."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rose_core.app.rl.algorithm.trajectory import check_sampling


@dataclass(slots=True, frozen=True)
class TrainSample:
    """The trainer scores ``response_token_ids`` given ``prompt_token_ids`` and weighs them by ``advantage``."""

    trajectory_id: str
    turn_index: int
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    weight_version: int
    advantage: float
    temperature: float = 1.0
    """The turn's sampling distribution (``Turn``): the trainer scores the tokens under it."""
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids or not self.response_token_ids:
            raise ValueError("a sample needs a non-empty prompt and response: build samples from finished turns")
        if len(self.behaviour_logprobs) != len(self.response_token_ids):
            raise ValueError("a sample needs one behaviour logprob per response token: pass the sampler's logprobs")
        if not math.isfinite(self.advantage):
            raise ValueError(f"advantage {self.advantage} must be finite: check the group rewards")
        if self.turn_index < 0:
            raise ValueError(f"turn index {self.turn_index} must be >= 0")
        check_sampling(self.temperature, self.top_p)

    @property
    def length(self) -> int:
        return len(self.prompt_token_ids) + len(self.response_token_ids)
