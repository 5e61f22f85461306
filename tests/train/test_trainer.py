"""The reference trainer: learning direction, clipping, behaviour-logprob correction, KL, weight export."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rose_core.app.config import RLConfig
from rose_core.app.rl.algorithm.loss_settings import LossSettings
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.demo.models import ModelPaths, load_tokenizer
from rose_core.app.rl.environments.frozenlake import FrozenLakeEnv
from rose_core.app.rl.trainer.trainer import PolicyTrainer, TrainerConfig, sampled_logprobs
from rose_core.app.rl_config import LossConfig
from rose_core.app.rl_config import TrainerConfig as RLTrainerConfig
from rose_core.support.errors import RoseError


def _samples(models: ModelPaths, advantages: list[float], responses: list[str] | None = None) -> list[TrainSample]:
    codec = load_tokenizer(models.policy)
    assert codec.bos_id is not None
    prompt = (codec.bos_id, *codec.encode(FrozenLakeEnv(seed=11).reset()))
    texts = responses or [" left", " up please", " right now", " down."]
    samples = []
    for index, advantage in enumerate(advantages):
        response = (*codec.encode(texts[index % len(texts)]), codec.eos_id)
        samples.append(TrainSample(f"t{index}", 0, prompt, response, tuple(-5.0 for _ in response), 0, advantage))
    return samples


def _mean_logprob(trainer: PolicyTrainer, samples: list[TrainSample]) -> float:
    values = [v for row in trainer.response_logprobs(samples) for v in row]
    return sum(values) / len(values)


def test_positive_advantages_raise_the_responses_logprob(models: ModelPaths) -> None:
    trainer = PolicyTrainer(models.policy, lr=1e-3)
    samples = _samples(models, [1.0, 1.0, 1.0, 1.0])
    before = _mean_logprob(trainer, samples)
    stats = trainer.train_step(samples)
    after = _mean_logprob(trainer, samples)
    assert after > before + 0.05
    assert stats.tokens == sum(len(s.response_token_ids) for s in samples) and stats.samples == 4
    assert stats.loss < 0 and stats.approx_kl > 0 and stats.seconds > 0 and trainer.steps == 1


def test_negative_advantages_lower_the_responses_logprob(models: ModelPaths) -> None:
    trainer = PolicyTrainer(models.policy, lr=1e-3)
    samples = _samples(models, [-1.0, -1.0])
    before = _mean_logprob(trainer, samples)
    trainer.train_step(samples)
    assert _mean_logprob(trainer, samples) < before - 0.05


def test_zero_advantages_leave_the_policy_unchanged(models: ModelPaths) -> None:
    trainer = PolicyTrainer(models.policy, lr=1e-2)
    samples = _samples(models, [0.0, 0.0])
    before = trainer.export_weights()
    stats = trainer.train_step(samples)
    assert stats.loss == 0.0 and stats.clip_fraction == 0.0
    after = trainer.export_weights()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_clipping_engages_when_a_sample_is_reused_with_a_large_step(models: ModelPaths) -> None:
    samples = _samples(models, [1.0, -1.0])
    gentle = PolicyTrainer(models.policy, lr=1e-6, epochs=1).train_step(samples)
    assert gentle.clip_fraction == 0.0
    narrow = LossSettings(clip_low=0.1, clip_high=0.1)
    aggressive = PolicyTrainer(models.policy, lr=5e-2, epochs=4, loss=narrow).train_step(samples)
    assert aggressive.clip_fraction > 0.0
    assert aggressive.approx_kl > gentle.approx_kl


def test_exported_weights_match_the_checkpoint_names_and_the_params(models: ModelPaths) -> None:
    trainer = PolicyTrainer(models.policy, lr=1e-3)
    trainer.train_step(_samples(models, [1.0, -1.0]))
    exported = trainer.export_weights()
    with safe_open(str(models.policy / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        shapes = {name: handle.get_slice(name).get_shape() for name in names}
    assert set(exported) == names
    params = dict(trainer.model.named_parameters())
    for name, tensor in exported.items():
        assert tensor.dtype == torch.bfloat16 and tensor.is_contiguous()
        assert list(tensor.shape) == shapes[name]
        assert torch.equal(tensor, params[name].detach().to(torch.bfloat16))
        assert tensor.data_ptr() != params[name].data_ptr()
    assert params["model.embed_tokens.weight"].dtype == torch.float32


def test_saved_model_reloads_with_the_trained_weights(models: ModelPaths, tmp_path: Path) -> None:
    trainer = PolicyTrainer(models.policy, lr=1e-3)
    trainer.train_step(_samples(models, [1.0, -1.0]))
    trainer.save(tmp_path / "saved")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16)
    exported = trainer.export_weights()
    state = reloaded.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in exported.items())
    assert (tmp_path / "saved" / "tokenizer.json").is_file()


def test_logprob_gap_is_small_for_the_trainers_own_logprobs(models: ModelPaths) -> None:
    trainer = PolicyTrainer(models.policy)
    samples = _samples(models, [1.0, -1.0])
    own = trainer.response_logprobs(samples)
    honest = [
        TrainSample(s.trajectory_id, 0, s.prompt_token_ids, s.response_token_ids, tuple(lp), 0, s.advantage)
        for s, lp in zip(samples, own, strict=True)
    ]
    assert trainer.train_step(honest).logprob_gap < 1e-5
    stale = [
        TrainSample(s.trajectory_id, 0, s.prompt_token_ids, s.response_token_ids, tuple(lp - 2.0 for lp in row), 0, 0.0)
        for s, row in zip(samples, trainer.response_logprobs(samples), strict=True)
    ]
    assert trainer.train_step(stale).logprob_gap == pytest.approx(2.0, abs=1e-4)


def test_bad_inputs_are_refused(models: ModelPaths, tmp_path: Path) -> None:
    trainer = PolicyTrainer(models.policy)
    with pytest.raises(ValueError, match="no samples"):
        trainer.train_step([])
    with pytest.raises(ValueError, match="vocabulary"):
        trainer.train_step([TrainSample("t", 0, (1, 5000), (3,), (-1.0,), 0, 1.0)])
    with pytest.raises(ValueError, match="tokens"):
        trainer.train_step([TrainSample("t", 0, tuple([5] * 2048), (3,), (-1.0,), 0, 1.0)])
    with pytest.raises(ValueError, match="clip_low"):
        TrainerConfig(loss=LossSettings(clip_low=1.5))
    with pytest.raises(RoseError, match="ensure_models"):
        PolicyTrainer(tmp_path)


def test_micro_batches_give_the_same_update_as_one_batch(models: ModelPaths) -> None:
    samples = _samples(models, [1.0, -0.5, 0.25, -0.75, 1.0], [" left", " up up", "x", " down the hole", "y z"])
    whole = PolicyTrainer(models.policy, lr=1e-3, micro_batch_size=8)
    split = PolicyTrainer(models.policy, lr=1e-3, micro_batch_size=2)
    a, b = whole.train_step(samples), split.train_step(samples)
    assert a.loss == pytest.approx(b.loss, abs=1e-5) and a.tokens == b.tokens
    wa, wb = whole.export_weights(), split.export_weights()
    mismatched = [n for n in wa if not torch.allclose(wa[n].float(), wb[n].float(), atol=1e-2)]
    assert not mismatched


def _with_behaviour(samples: list[TrainSample], logprobs: list[list[float]], shift: float = 0.0) -> list[TrainSample]:
    """The samples with the given behaviour logprobs (plus ``shift``): the sampler's as the trainer sees them."""
    return [
        TrainSample(s.trajectory_id, 0, s.prompt_token_ids, s.response_token_ids, tuple(v + shift for v in row),
                    s.weight_version, s.advantage)
        for s, row in zip(samples, logprobs, strict=True)
    ]


DAPO = LossSettings(clip_low=0.2, clip_high=0.28, loss_agg="token_mean")


def test_a_dapo_step_on_policy_reports_ratios_near_one(models: ModelPaths) -> None:
    trainer = PolicyTrainer(models.policy, lr=1e-2, epochs=3, loss=DAPO)
    samples = _samples(models, [1.0, -1.0, 0.5, -0.5])
    samples = _with_behaviour(samples, trainer.response_logprobs(samples))
    stats = trainer.train_step(samples)
    assert math.isfinite(stats.loss) and stats.tokens > 0
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-4)
    assert stats.behaviour_ratio_mean == pytest.approx(1.0, abs=1e-4)
    assert stats.tis_truncated_fraction == 0.0 and stats.kl_ref is None
    assert 0.0 < stats.clip_fraction < 1.0  # later epochs move past 1 + 0.28 with lr 1e-2
    assert trainer.config.loss == DAPO


def test_stale_behaviour_logprobs_are_weighted_by_the_capped_ratio(models: ModelPaths) -> None:
    samples = _samples(models, [1.0, 0.5])
    own = PolicyTrainer(models.policy).response_logprobs(samples)
    settings = LossSettings(loss_agg="token_mean", tis_cap=2.0)
    honest = PolicyTrainer(models.policy, epochs=1, loss=settings).train_step(_with_behaviour(samples, own))
    # behaviour 2 nats below proximal: proximal/behaviour = e^2 = 7.39 on every token, capped at 2
    stale = PolicyTrainer(models.policy, epochs=1, loss=settings).train_step(_with_behaviour(samples, own, -2.0))
    assert honest.tis_truncated_fraction == 0.0 and stale.tis_truncated_fraction == 1.0
    assert stale.behaviour_ratio_mean == pytest.approx(math.exp(2.0), rel=1e-3)
    assert stale.ratio_mean == pytest.approx(math.exp(2.0), rel=1e-3)
    # one epoch, new = proximal, ratio 1: the loss is -mean(w * A) over tokens, so the capped weight doubles it
    assert honest.loss < 0 and stale.loss == pytest.approx(2.0 * honest.loss, rel=1e-4)
    # behaviour 0.5 nats above proximal: weight e^-0.5 = 0.607, not truncated
    fresh = PolicyTrainer(models.policy, epochs=1, loss=settings).train_step(_with_behaviour(samples, own, 0.5))
    assert fresh.tis_truncated_fraction == 0.0
    assert fresh.loss == pytest.approx(math.exp(-0.5) * honest.loss, rel=1e-4)


def test_kl_to_the_frozen_reference(models: ModelPaths) -> None:
    trainer = PolicyTrainer(models.policy, lr=1e-2, loss=LossSettings(kl_coef=0.1))
    assert trainer.reference is not None
    initial = {n: p.detach().clone() for n, p in trainer.reference.named_parameters()}
    samples = _samples(models, [1.0, -1.0])
    samples = _with_behaviour(samples, trainer.response_logprobs(samples))
    first = trainer.train_step(samples)
    assert first.kl_ref == pytest.approx(0.0, abs=1e-6)  # the policy starts as the reference
    second = trainer.train_step(samples)
    assert second.kl_ref is not None and second.kl_ref > 1e-4
    assert all(torch.equal(p, initial[n]) for n, p in trainer.reference.named_parameters())
    assert all(not p.requires_grad for p in trainer.reference.parameters())


def test_from_config_builds_the_jobs_loss(models: ModelPaths) -> None:
    rl = RLConfig(algorithm="dapo", loss=LossConfig(kl_coef=0.05), trainer=RLTrainerConfig(lr=2e-3, epochs=3),
                  max_tokens_per_turn=16)
    trainer = PolicyTrainer.from_config(models.policy, rl)
    assert trainer.config.loss == LossSettings(clip_low=0.2, clip_high=0.28, loss_agg="token_mean", kl_coef=0.05,
                                               tis_cap=2.0, max_response_tokens=16)
    assert (trainer.config.lr, trainer.config.epochs) == (2e-3, 3) and trainer.reference is not None
    dr = PolicyTrainer.from_config(models.policy, RLConfig(
        loss=LossConfig(loss_agg="seq_mean_token_sum_norm", advantage_std_norm=False)))
    assert dr.config.loss.max_response_tokens == RLConfig().max_tokens_per_turn and dr.reference is None
    stats = dr.train_step(_samples(models, [1.0, -1.0]))
    assert math.isfinite(stats.loss) and stats.kl_ref is None


def test_sampled_logprobs_score_the_distribution_the_engine_sampled_from() -> None:
    """Temperature divides the logits (0, greedy, counts as 1, as vLLM reports it); top-p keeps vLLM's nucleus
    (ascending cumulative probability above ``1 - top_p``, the most likely token always) and renormalises; the
    sampled token is scored even when a rounding puts it just outside."""
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]])).repeat(4, 1, 1)
    targets = torch.tensor([[0], [1], [3], [0]])
    out = sampled_logprobs(logits, targets, torch.tensor([[1.0], [0.5], [1.0], [0.0]]),
                           torch.tensor([[1.0], [1.0], [0.7], [0.1]]))
    assert torch.allclose(out[0], torch.log_softmax(logits[0], -1))
    assert torch.allclose(out[1], torch.log_softmax(logits[1] / 0.5, -1))
    nucleus = torch.log(torch.tensor([0.5, 0.3, 0.05]) / 0.85)  # 0.15 dropped (cumulative 0.2 <= 0.3), 0.05 kept:
    assert torch.allclose(out[2, 0, [0, 1, 3]], nucleus) and out[2, 0, 2] == float("-inf")  # it was sampled
    assert out[3, 0, 0] == 0.0 and torch.isinf(out[3, 0, 1:]).all()  # greedy at 1, top-p 0.1: only the argmax
