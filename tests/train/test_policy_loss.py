"""The policy loss's pure tensor functions against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rose_core.app.rl.algorithm.loss_settings import LossSettings
from rose_core.app.rl.algorithm.policy_loss import (
    LossNorm,
    PolicyLoss,
    aggregate,
    clipped_surrogate,
    k3_kl,
    policy_loss,
    truncated_is_weight,
)

GRPO = LossSettings(clip_low=0.2, clip_high=0.2, loss_agg="seq_mean_token_mean")
DAPO = LossSettings(clip_low=0.2, clip_high=0.28, loss_agg="token_mean")


def _log(values: list[list[float]]) -> torch.Tensor:
    return torch.log(torch.tensor(values, dtype=torch.float64))


# Two rows, three tokens; the second row has two. proximal = behaviour (on-policy), so the IS weight is 1 and
# the ratio new/proximal is RATIOS. Row 0 has advantage +1, row 1 advantage -2.
RATIOS = [[1.5, 1.0, 0.7], [0.5, 1.1, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
ADVANTAGES = torch.tensor([1.0, -2.0], dtype=torch.float64)
PROBS = [[0.5, 0.25, 0.4], [0.2, 0.6, 1.0]]


def _loss(settings: LossSettings, ratios: list[list[float]] = RATIOS) -> tuple[torch.Tensor, PolicyLoss]:
    proximal = _log(PROBS) * MASK
    new = (proximal + _log(ratios)) * MASK
    new.requires_grad_(True)
    terms = policy_loss(new, proximal, proximal.clone(), MASK, ADVANTAGES, settings, LossNorm.of(MASK))
    return new, terms


def test_grpo_loss_matches_the_hand_computation() -> None:
    # row 0 (A=+1): clamp(r, 0.8, 1.2) = [1.2, 1.0, 0.8]; min(r*A, clamp*A) = [1.2, 1.0, 0.7] -> [-1.2, -1.0, -0.7]
    # row 1 (A=-2): r*A = [-1.0, -2.2], clamp*A = [-1.6, -2.2]; min = [-1.6, -2.2] -> [1.6, 2.2]
    # seq_mean_token_mean: (-2.9 / 3 + 3.8 / 2) / 2 = (-0.966667 + 1.9) / 2 = 0.466667
    _, terms = _loss(GRPO)
    assert float(terms.loss.detach()) == pytest.approx(0.466667, abs=1e-6)
    # clipped: row 0 token 0 (1.5 > 1.2, A > 0) and row 1 token 0 (0.5 < 0.8, A < 0)
    assert terms.clipped == 2.0
    assert terms.truncated == 0.0 and terms.kl == 0.0
    # on-policy: new/behaviour sums the ratios over the 5 real tokens; proximal/behaviour is 1 on each
    assert terms.ratio == pytest.approx(1.5 + 1.0 + 0.7 + 0.5 + 1.1) and terms.behaviour_ratio == pytest.approx(5.0)


def test_dapo_loss_clips_higher_and_averages_over_tokens() -> None:
    # row 0 token 0 is clamped at 1 + 0.28: [-1.28, -1.0, -0.7]; row 1 as in GRPO: [1.6, 2.2]
    # token_mean: (-2.98 + 3.8) / 5 = 0.164
    _, terms = _loss(DAPO)
    assert float(terms.loss.detach()) == pytest.approx(0.164, abs=1e-6)
    assert terms.clipped == 2.0


def test_the_three_aggregations() -> None:
    # per-token losses of the GRPO case: [[-1.2, -1.0, -0.7], [1.6, 2.2, (masked)]]
    per_token = torch.tensor([[-1.2, -1.0, -0.7], [1.6, 2.2, 99.0]], dtype=torch.float64)
    norm = LossNorm.of(MASK)
    assert (norm.tokens, norm.sequences) == (5, 2)
    # (-2.9 + 3.8) / 5 = 0.18
    assert float(aggregate(per_token, MASK, "token_mean", norm)) == pytest.approx(0.18)
    # (-2.9 / 3 + 3.8 / 2) / 2 = 0.466667
    assert float(aggregate(per_token, MASK, "seq_mean_token_mean", norm)) == pytest.approx(0.466667, abs=1e-6)
    # (-2.9 / 4 + 3.8 / 4) / 2 = (-0.725 + 0.95) / 2 = 0.1125
    assert float(aggregate(per_token, MASK, "seq_mean_token_sum_norm", norm, max_tokens=4)) == pytest.approx(0.1125)
    with pytest.raises(ValueError, match="max_tokens 0"):
        aggregate(per_token, MASK, "seq_mean_token_sum_norm", norm)
    with pytest.raises(ValueError, match="token_mean"):
        aggregate(per_token, MASK, "sum", norm)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_with_the_step_norm_sum_to_the_whole(mode: str) -> None:
    per_token = torch.tensor([[-1.2, -1.0, -0.7], [1.6, 2.2, 0.0], [0.3, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    norm = LossNorm.of(mask)
    whole = aggregate(per_token, mask, mode, norm, max_tokens=3)
    parts = aggregate(per_token[:2], mask[:2], mode, norm, 3) + aggregate(per_token[2:], mask[2:], mode, norm, 3)
    assert float(parts) == pytest.approx(float(whole))


def test_asymmetric_clip_counts() -> None:
    # rows: r=1.25 A=+1 | r=0.75 A=-1 | r=1.25 A=-1 (the pessimistic min never clips a rise with A < 0)
    ratio = torch.tensor([[1.25], [0.75], [1.25]])
    advantages = torch.tensor([1.0, -1.0, -1.0])
    _, grpo = clipped_surrogate(ratio, advantages, 0.2, 0.2)
    _, dapo = clipped_surrogate(ratio, advantages, 0.2, 0.28)
    assert grpo.squeeze(1).tolist() == [True, True, False]  # 1.25 > 1.2; 0.75 < 0.8
    assert dapo.squeeze(1).tolist() == [False, True, False]  # 1.25 <= 1.28: clip-higher lets it rise
    surrogate, _ = clipped_surrogate(ratio, advantages, 0.2, 0.28)
    # -min(1.25, 1.25) = -1.25; -min(-0.75, -0.8) = 0.8; -min(-1.25, -1.2) = 1.25
    assert surrogate.squeeze(1).tolist() == pytest.approx([-1.25, 0.8, 1.25])


def test_clipped_tokens_get_no_gradient() -> None:
    new, terms = _loss(GRPO)
    terms.loss.backward()
    grad = new.grad
    assert grad is not None
    # clipped: (0, 0) and (1, 0); the masked (1, 2) also 0
    assert grad[0, 0] == 0.0 and grad[1, 0] == 0.0 and grad[1, 2] == 0.0
    # row 0 token 1: d/dnew of -(r * A) / 3 / 2 with r = 1, A = 1 -> -1/6
    assert float(grad[0, 1]) == pytest.approx(-1.0 / 6.0)
    # row 1 token 1: -(r * A) / 2 / 2 with r = 1.1, A = -2 -> +0.55
    assert float(grad[1, 1]) == pytest.approx(0.55)


def test_truncated_is_weight() -> None:
    # proximal/behaviour = 3 (capped at 2), 0.5, 1
    proximal = torch.log(torch.tensor([[0.6, 0.1, 0.3]]))
    behaviour = torch.log(torch.tensor([[0.2, 0.2, 0.3]]))
    weight, truncated = truncated_is_weight(proximal, behaviour, cap=2.0)
    assert weight.tolist()[0] == pytest.approx([2.0, 0.5, 1.0])
    assert truncated.tolist()[0] == [True, False, False]
    far = truncated_is_weight(torch.tensor([[0.0]]), torch.tensor([[-1e4]]), cap=2.0)[0]
    assert float(far) == pytest.approx(2.0)  # computed in log space: no overflow


def test_the_ratio_and_the_weight_use_the_behaviour_logprobs() -> None:
    # first epoch (new = proximal), A = +1 on two tokens, token_mean, tis_cap 2
    proximal = torch.log(torch.tensor([[0.6, 0.1]]))
    mask = torch.ones(1, 2)
    advantages = torch.tensor([1.0])
    settings = LossSettings(loss_agg="token_mean", tis_cap=2.0)

    def run(behaviour: torch.Tensor) -> tuple[float, list[float], PolicyLoss]:
        new = proximal.clone().requires_grad_(True)
        terms = policy_loss(new, proximal, behaviour, mask, advantages, settings, LossNorm.of(mask))
        terms.loss.backward()
        assert new.grad is not None
        return float(terms.loss.detach()), new.grad.tolist()[0], terms

    # behaviour = proximal: weight 1, loss -(1 + 1) / 2 = -1, gradient -1/2 on each token
    loss, grad, terms = run(proximal.clone())
    assert loss == pytest.approx(-1.0) and grad == pytest.approx([-0.5, -0.5])
    assert terms.truncated == 0.0 and terms.behaviour_ratio == pytest.approx(2.0)
    # behaviour = [0.2, 0.2]: proximal/behaviour = [3 -> capped 2, 0.5]; loss -(2 + 0.5) / 2 = -1.25,
    # gradient -w / 2 = [-1, -0.25]; ratio new/behaviour sums 3 + 0.5, one token truncated
    loss, grad, terms = run(torch.log(torch.tensor([[0.2, 0.2]])))
    assert loss == pytest.approx(-1.25) and grad == pytest.approx([-1.0, -0.25])
    assert terms.truncated == 1.0
    assert terms.ratio == pytest.approx(3.5) and terms.behaviour_ratio == pytest.approx(3.5)


def test_k3_kl_values_and_its_expectation_is_the_kl() -> None:
    # new 0.5, reference 0.25: d = log(0.5) = -0.693147; exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    new = torch.log(torch.tensor([[0.5, 0.3]], dtype=torch.float64))
    reference = torch.log(torch.tensor([[0.25, 0.3]], dtype=torch.float64))
    assert k3_kl(new, reference).tolist()[0] == pytest.approx([0.193147, 0.0], abs=1e-6)
    # E_{x ~ p}[k3] = sum p (q/p) - sum p log(q/p) - 1 = KL(p || q), exactly, over a whole vocabulary
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    expected = float((p * (p / q).log()).sum())  # 0.5 ln 2.5 + 0.2 ln 0.4 = 0.458145 - 0.183258 = 0.274887
    assert expected == pytest.approx(0.274887, abs=1e-6)
    assert float((p * k3_kl(p.log(), q.log())).sum()) == pytest.approx(expected)


def test_kl_term_adds_to_the_loss_with_its_coefficient() -> None:
    # A = 0 leaves only the KL: 0.1 * (0.193147 + 0) / 2 = 0.00965736 (token_mean)
    new = torch.log(torch.tensor([[0.5, 0.3]], dtype=torch.float64)).requires_grad_(True)
    reference = torch.log(torch.tensor([[0.25, 0.3]], dtype=torch.float64))
    mask = torch.ones(1, 2, dtype=torch.float64)
    settings = LossSettings(loss_agg="token_mean", kl_coef=0.1)
    proximal = new.detach()
    terms = policy_loss(new, proximal, proximal, mask, torch.zeros(1, dtype=torch.float64), settings,
                        LossNorm.of(mask), reference)
    assert float(terms.loss.detach()) == pytest.approx(0.00965736, abs=1e-8)
    assert terms.kl == pytest.approx(0.193147, abs=1e-6)
    terms.loss.backward()
    # d k3 / d new = 1 - exp(reference - new) = 1 - 0.5; times 0.1 / 2 -> 0.025 (and 0 where new = reference)
    assert new.grad is not None and new.grad.tolist()[0] == pytest.approx([0.025, 0.0])
    with pytest.raises(ValueError, match="reference="):
        policy_loss(new, proximal, proximal, mask, torch.zeros(1), settings, LossNorm.of(mask))


def test_dr_grpo_sum_norm_has_no_length_bias() -> None:
    # two on-policy rows with A = +1, of 1 and 3 tokens
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    proximal = torch.full((2, 3), math.log(0.5)) * mask
    advantages = torch.tensor([1.0, 1.0])

    def grad(settings: LossSettings) -> list[float]:
        new = proximal.clone().requires_grad_(True)
        policy_loss(new, proximal, proximal, mask, advantages, settings, LossNorm.of(mask)).loss.backward()
        assert new.grad is not None
        return new.grad.flatten().tolist()

    # GRPO: each row's tokens share 1/2 of the weight: -1/(2*1) on the short row, -1/(2*3) on the long one
    assert grad(GRPO) == pytest.approx([-0.5, 0, 0, -1 / 6, -1 / 6, -1 / 6])
    # Dr. GRPO: every token -1/(2*4) whatever its row's length
    dr = LossSettings(loss_agg="seq_mean_token_sum_norm", max_response_tokens=4)
    assert grad(dr) == pytest.approx([-0.125, 0, 0, -0.125, -0.125, -0.125])
    # DAPO's token mean: every token -1/4
    assert grad(DAPO) == pytest.approx([-0.25, 0, 0, -0.25, -0.25, -0.25])


def test_loss_settings_and_norm_validate() -> None:
    with pytest.raises(ValueError, match=r"`clip_high` 0\.1 must be >= `clip_low` 0\.2"):
        LossSettings(clip_high=0.1)
    with pytest.raises(ValueError, match=r"rl\.max_tokens_per_turn"):
        LossSettings(loss_agg="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="non-empty batch"):
        LossNorm(tokens=0, sequences=1)
