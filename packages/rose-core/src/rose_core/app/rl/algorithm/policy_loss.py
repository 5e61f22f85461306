"""The policy loss as pure tensor functions: decoupled PPO clip, truncated IS, k3 KL, and the aggregations.

Three logprobs per response token, each ``[B, T]`` and zero where ``mask`` is 0:
- ``new``: the policy being updated (carries the gradient);
- ``proximal``: the same policy before this step's first optimizer step (detached): the PPO clip is on
  ``new / proximal``, so the trust region is around the current weights whatever version sampled the turn;
- ``behaviour``: the sampler's (vLLM, often bf16, possibly an older weight version): each token's loss is
  weighted by ``min(proximal / behaviour, tis_cap)`` (truncated importance sampling), which corrects stale turns.

``docs/rl.md`` has the formulas. Exponentials of log-ratios are taken in fp32 with the exponent bounded
(``LOG_RATIO_BOUND``) so a wildly off sampler logprob gives a large finite number, never ``inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rose_core.app.config import LOSS_AGGREGATIONS
from rose_core.app.rl.algorithm.loss_settings import LossSettings
from rose_core.support.errors import require_extra

with require_extra("torch (the policy loss)", "rose-core[train]"):
    import torch

LOG_RATIO_BOUND = 20.0
"""Log-ratios are clamped to +-this before ``exp`` (in the stats and the KL; the IS weight is capped anyway)."""


@dataclass(slots=True, frozen=True)
class LossNorm:
    """The sizes of the whole step's batch. Micro-batch losses aggregated with the step's norm sum to the loss
    of the batch in one piece, so micro-batching does not change the update."""

    tokens: int
    sequences: int

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.sequences < 1:
            raise ValueError(f"a loss over {self.tokens} tokens of {self.sequences} samples: pass a non-empty batch")

    @classmethod
    def of(cls, mask: torch.Tensor) -> LossNorm:
        """The norm of ``mask`` alone (one batch, every row a sample)."""
        return cls(tokens=int(mask.sum()), sequences=int(mask.shape[0]))


@dataclass(slots=True, frozen=True)
class PolicyLoss:
    """The loss (a scalar with the gradient of ``new``) and sums over this batch's response tokens:
    ``clipped`` tokens whose update the clip stopped, ``truncated`` tokens whose IS weight hit the cap,
    ``ratio`` of new/behaviour, ``behaviour_ratio`` of proximal/behaviour, ``kl`` of the k3 estimate to the
    reference (0 without one)."""

    loss: torch.Tensor
    clipped: float
    truncated: float
    ratio: float
    behaviour_ratio: float
    kl: float


def policy_loss(
    new: torch.Tensor,
    proximal: torch.Tensor,
    behaviour: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    settings: LossSettings,
    norm: LossNorm,
    reference: torch.Tensor | None = None,
    turn_tokens: torch.Tensor | None = None,
) -> PolicyLoss:
    """``aggregate(w * clipped_surrogate + kl_coef * k3)`` with ``w`` the truncated IS weight. ``advantages``:
    per row ([B]) or per token ([B, T], a row holding several turns); ``turn_tokens``: see ``aggregate``."""
    ratio = torch.exp(new - proximal)
    surrogate, clipped = clipped_surrogate(ratio, advantages, settings.clip_low, settings.clip_high)
    weight, truncated = truncated_is_weight(proximal, behaviour, settings.tis_cap)
    per_token = weight * surrogate
    kl = torch.zeros_like(new)
    if settings.kl_coef > 0.0:
        if reference is None:
            raise ValueError(f"kl_coef {settings.kl_coef} > 0 needs the reference logprobs: pass reference=")
        kl = k3_kl(new, reference)
        per_token = per_token + settings.kl_coef * kl
    loss = aggregate(per_token, mask, settings.loss_agg, norm, settings.max_response_tokens, turn_tokens)
    return PolicyLoss(
        loss=loss,
        clipped=_masked_sum(clipped.float(), mask),
        truncated=_masked_sum(truncated.float(), mask),
        ratio=_masked_sum(_bounded_exp(new.detach() - behaviour), mask),
        behaviour_ratio=_masked_sum(_bounded_exp(proximal - behaviour), mask),
        kl=_masked_sum(kl.detach(), mask),
    )


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token ``-min(r * A, clamp(r, 1 - clip_low, 1 + clip_high) * A)`` (``advantages`` is per row, [B]),
    and where the clip is active (the token's gradient is zero: r above 1 + clip_high with A > 0, or below
    1 - clip_low with A < 0)."""
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    bounded = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    surrogate = -torch.minimum(ratio * adv, bounded * adv)
    clipped = ((ratio > 1.0 + clip_high) & (adv > 0)) | ((ratio < 1.0 - clip_low) & (adv < 0))
    return surrogate, clipped


def truncated_is_weight(
    proximal: torch.Tensor, behaviour: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``min(proximal / behaviour, cap)`` per token, detached, computed in log space; and where it hit the cap."""
    log_ratio = (proximal - behaviour).detach()
    log_cap = math.log(cap)
    return torch.exp(torch.clamp(log_ratio, min=-LOG_RATIO_BOUND, max=log_cap)), log_ratio > log_cap


def k3_kl(new: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(new || reference) per sampled token: ``exp(d) - d - 1`` with
    ``d = reference - new`` (unbiased, always >= 0, low variance)."""
    d = torch.clamp(reference - new, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.exp(d) - d - 1.0


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: LossNorm, max_tokens: int = 0,
    turn_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """One number from ``[B, T]`` per-token losses (``LOSS_AGGREGATIONS``), a sample being one turn:

    - ``token_mean``: sum over all tokens / ``norm.tokens`` (DAPO: long samples weigh more);
    - ``seq_mean_token_mean``: per sample sum / its token count, summed / ``norm.sequences`` (GRPO);
    - ``seq_mean_token_sum_norm``: per sample sum / ``max_tokens``, summed / ``norm.sequences`` (Dr. GRPO: no
      length bias).

    A row is one sample unless ``turn_tokens`` ([B, T]: each token's own turn's response length) says a row
    packs several turns (one sequence per trajectory): each token is then divided by its turn's length, so
    packing never changes the loss."""
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum() / norm.tokens
    if mode == "seq_mean_token_mean" and turn_tokens is not None:
        return (masked / turn_tokens.clamp(min=1.0)).sum() / norm.sequences
    rows = masked.sum(dim=1)
    if mode == "seq_mean_token_mean":
        rows = rows / mask.sum(dim=1).clamp(min=1.0)
    elif mode == "seq_mean_token_sum_norm":
        if max_tokens < 1:
            raise ValueError(f"max_tokens {max_tokens} must be >= 1 with seq_mean_token_sum_norm: pass the budget")
        rows = rows / max_tokens
    else:
        raise ValueError(f"loss aggregation {mode!r} is unknown: use one of {list(LOSS_AGGREGATIONS)}")
    return rows.sum() / norm.sequences


def _bounded_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def _masked_sum(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum())
