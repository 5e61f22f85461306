"""Multi-turn prompt assembly in token space.

The prompt of turn k is ``header + obs_0 + resp_0 + obs_1 + ... + obs_k``: the exact tokens sampled earlier are
reused (never re-tokenized text), so the trainer scores the same sequence the sampler saw. A prompt longer than
``max_prompt_tokens`` loses its oldest (observation, response) pairs first, then the oldest tokens of what is
left; the header (the instructions of the first observation) is always kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def assemble_prompt(header: Sequence[int], segments: Sequence[Sequence[int]], max_tokens: int) -> list[int]:
    """``header`` followed by as many trailing whole pairs of ``segments`` as fit, cut to ``max_tokens``.

    ``segments`` alternate observation, response, observation, ...; the last one is the current observation.
    """
    room = max_tokens - len(header)
    if room < 1:
        raise ValueError(
            f"the header takes {len(header)} of {max_tokens} prompt tokens: raise max_prompt_tokens or shorten it"
        )
    if not segments:
        raise ValueError("no observation to prompt with: add the first observation before asking for a prompt")
    first = _first_fitting_pair(segments, room)
    body = [token for segment in segments[first:] for token in segment]
    return [*header, *body[-room:]]


def _first_fitting_pair(segments: Sequence[Sequence[int]], room: int) -> int:
    """The lowest even index (an observation) from which the rest fits in ``room``; the last one otherwise."""
    start = len(segments) - 1 if (len(segments) - 1) % 2 == 0 else len(segments) - 2
    best = max(start, 0)
    used = sum(len(s) for s in segments[best:])
    index = best - 2
    while index >= 0:
        used += len(segments[index]) + len(segments[index + 1])
        if used > room:
            break
        best = index
        index -= 2
    return best


@dataclass(slots=True)
class Conversation:
    """The token history of one trajectory: a header, then observations and responses in turn."""

    header: tuple[int, ...]
    max_prompt_tokens: int
    segments: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_prompt_tokens <= len(self.header):
            raise ValueError(
                f"max_prompt_tokens {self.max_prompt_tokens} leaves no room after a {len(self.header)}-token "
                "header: raise it"
            )

    def add_observation(self, token_ids: Sequence[int]) -> None:
        if len(self.segments) % 2 == 1:
            raise ValueError("an observation must follow a response: add the response of the previous turn first")
        self.segments.append(tuple(token_ids))

    def add_response(self, token_ids: Sequence[int]) -> None:
        if len(self.segments) % 2 == 0:
            raise ValueError("a response must follow an observation: add the observation first")
        self.segments.append(tuple(token_ids))

    def prompt(self) -> list[int]:
        """The prompt for the next turn; the conversation must end with an observation."""
        if len(self.segments) % 2 == 0:
            raise ValueError("the conversation ends with a response: add the next observation before prompting")
        return assemble_prompt(self.header, self.segments, self.max_prompt_tokens)
