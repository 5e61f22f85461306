"""What the co-serving admission controller observes: in-flight serving requests and candidate rollout work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RolloutWorkKind = Literal["decode", "prefill"]


@dataclass(slots=True, frozen=True)
class ServingRequest:
    """One in-flight serving request. ``remaining_prompt_tokens > 0``: still in prefill (TTFT pending);
    else decoding, ``last_token_at`` is when it emitted its latest token."""

    request_id: str
    arrival: float
    remaining_prompt_tokens: int = 0
    last_token_at: float | None = None

    def __post_init__(self) -> None:
        if self.remaining_prompt_tokens < 0:
            raise ValueError(f"`remaining_prompt_tokens` must be >= 0 (got {self.remaining_prompt_tokens})")
        if self.remaining_prompt_tokens == 0 and self.last_token_at is None:
            raise ValueError(f"serving request {self.request_id}: a decoding request needs `last_token_at`")

    @property
    def in_prefill(self) -> bool:
        return self.remaining_prompt_tokens > 0


@dataclass(slots=True, frozen=True)
class RolloutWork:
    """A candidate piece of rollout work for the next engine step: one decode step of one sequence, or a
    prefill of ``tokens`` prompt tokens (the admission controller chunks it)."""

    request_id: str
    kind: RolloutWorkKind
    tokens: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("decode", "prefill"):
            raise ValueError(f"`kind` must be 'decode' or 'prefill' (got {self.kind!r})")
        if self.tokens <= 0:
            raise ValueError(f"`tokens` must be > 0 (got {self.tokens})")
