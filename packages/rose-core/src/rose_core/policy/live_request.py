"""One in-flight request as an engine front-end sees it, on the host's monotonic clock: the co-serving guard's
view of engine state (the executor builds it from vLLM's request states; the simulator and benches build it
from their models). No vllm types."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LiveRequest:
    """A request the engine is working on right now.

    ``arrival_s`` and ``last_token_s`` are ``time.monotonic()`` seconds; ``last_token_s`` is ``None`` until
    the first token. ``prefilling`` is vLLM's own flag (True until the first token comes back).
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    tokens_out: int
    prefilling: bool
    last_token_s: float | None
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.max_tokens < 0 or self.tokens_out < 0:
            raise ValueError(f"live request {self.request_id}: token counts must be >= 0")

    @property
    def reserved_tokens(self) -> int:
        """Tokens of KV this request may hold by its end (prompt + every output token it may emit)."""
        return self.prompt_tokens + max(self.max_tokens, self.tokens_out)
