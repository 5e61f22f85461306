"""What one rollout produced: its turns (one LLM call each) and its reward."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class Turn:
    """One LLM call of a trajectory: the exact prompt sent, the tokens sampled and their sampler logprobs, and
    the distribution they were sampled from (``temperature``, ``top_p``: the logprobs are that distribution's,
    vLLM's processed ones, and the trainer scores the tokens under the same; 0: greedy, scored at 1 as vLLM
    reports it)."""

    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    weight_version: int
    reward: float = 0.0
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a turn needs a non-empty prompt: start the conversation with an observation")
        if not self.response_token_ids:
            raise ValueError("a turn needs at least one response token: sample with max_tokens >= 1")
        if len(self.behaviour_logprobs) != len(self.response_token_ids):
            raise ValueError(
                f"{len(self.behaviour_logprobs)} logprobs for {len(self.response_token_ids)} response tokens: "
                "request one logprob per sampled token"
            )
        if any(t < 0 for t in self.prompt_token_ids) or any(t < 0 for t in self.response_token_ids):
            raise ValueError("token ids must be non-negative: pass the ids the tokenizer produced")
        if any(not math.isfinite(x) or x > 0.0 for x in self.behaviour_logprobs):
            raise ValueError("behaviour logprobs must be finite and <= 0: pass log-probabilities, not probabilities")
        if self.weight_version < 0:
            raise ValueError(f"weight version {self.weight_version} must be >= 0")
        check_sampling(self.temperature, self.top_p)


def check_sampling(temperature: float, top_p: float) -> None:
    """A turn's sampling distribution, as the trainer can score it."""
    if not (math.isfinite(temperature) and temperature >= 0.0):
        raise ValueError(f"temperature {temperature} must be a finite number >= 0")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p {top_p} must be in (0, 1]")


@dataclass(slots=True)
class Trajectory:
    """A multi-turn rollout of one environment episode. Trajectories of one group share ``env_seed``."""

    trajectory_id: str
    group_id: str
    env_seed: int
    turns: list[Turn] = field(default_factory=list)
    total_reward: float = 0.0
    done: bool = False
    success: bool = False
    """The episode reached its goal (set by ``finish``)."""

    def __post_init__(self) -> None:
        if not self.trajectory_id or not self.group_id:
            raise ValueError("a trajectory needs a trajectory_id and a group_id: pass non-empty strings")
        if not math.isfinite(self.total_reward):
            raise ValueError(f"total reward {self.total_reward} must be finite")

    def add_turn(self, turn: Turn) -> None:
        """Append a finished turn and add its reward; a done trajectory takes no more turns."""
        if self.done:
            raise ValueError(f"trajectory {self.trajectory_id} is done: start a new one for more turns")
        if not math.isfinite(turn.reward):
            raise ValueError(f"turn reward {turn.reward} must be finite")
        self.turns.append(turn)
        self.total_reward += turn.reward

    def finish(self, success: bool = False) -> None:
        self.done = True
        self.success = success

    @property
    def response_tokens(self) -> int:
        return sum(len(t.response_token_ids) for t in self.turns)
