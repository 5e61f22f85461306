"""The policy loss's settings (clip, aggregation, KL, truncated IS), torch-free so configs can build them."""

from __future__ import annotations

from dataclasses import dataclass

from rose_core.app.config import RLConfig, validate_policy_loss


@dataclass(slots=True, frozen=True)
class LossSettings:
    """Defaults are GRPO's (``ALGORITHMS["grpo"]``); ``docs/rl.md`` explains each field.

    ``max_response_tokens`` is the constant length of ``seq_mean_token_sum_norm`` (Dr. GRPO): each sample's
    token sum is divided by it; the other aggregations ignore it."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: str = "seq_mean_token_mean"
    kl_coef: float = 0.0
    tis_cap: float = 2.0
    max_response_tokens: int = 0

    def __post_init__(self) -> None:
        validate_policy_loss(
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            loss_agg=self.loss_agg,
            kl_coef=self.kl_coef,
            tis_cap=self.tis_cap,
        )
        if self.loss_agg == "seq_mean_token_sum_norm" and self.max_response_tokens < 1:
            raise ValueError(
                f"max_response_tokens {self.max_response_tokens} must be >= 1 with seq_mean_token_sum_norm: "
                "pass the turn's token budget (rl.max_tokens_per_turn)"
            )

    @classmethod
    def from_config(cls, rl: RLConfig) -> LossSettings:
        """The job's settings; a sample is one turn, so Dr. GRPO's constant is ``rl.max_tokens_per_turn``."""
        return cls(
            clip_low=rl.loss.clip_low,
            clip_high=rl.loss.clip_high,
            loss_agg=rl.loss.loss_agg,
            kl_coef=rl.loss.kl_coef,
            tis_cap=rl.loss.tis_cap,
            max_response_tokens=rl.max_tokens_per_turn,
        )
