"""The reference GRPO trainer: learning direction, clipping, weight export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rose_core.errors import RoseError
from rose_core.rl.frozenlake import FrozenLakeEnv
from rose_core.rl.models import ModelPaths, load_tokenizer
from rose_core.rl.sample import TrainSample
from rose_core.rl.trainer import PolicyTrainer, TrainerConfig


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
    aggressive = PolicyTrainer(models.policy, lr=5e-2, epochs=4, clip_eps=0.1).train_step(samples)
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
    with pytest.raises(ValueError, match="clip_eps"):
        TrainerConfig(clip_eps=1.5)
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
