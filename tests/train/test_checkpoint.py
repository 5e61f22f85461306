"""Trainer checkpoints: a resumed trainer takes the same next step, bit for bit, with the same generators."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from rose_core.app.rl.demo.models import ModelPaths
from rose_core.app.rl.trainer.checkpoint_dir import STATE_FILE, CheckpointError, read_state
from rose_core.app.rl.trainer.trainer import PolicyTrainer
from rose_core.app.rl.trainer.trainer_state import load_checkpoint, save_checkpoint

MakeTrainer = Callable[..., PolicyTrainer]


def _optimizer_step(trainer: PolicyTrainer) -> None:
    """One AdamW step on a fixed next-token loss (independent of the trainer's own loss functions)."""
    ids = (torch.arange(24).reshape(3, 8) * 7) % trainer.vocab_size
    trainer.optimizer.zero_grad(set_to_none=True)
    logits = trainer.model(input_ids=ids).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()  # type: ignore[no-untyped-call]
    trainer.optimizer.step()


def _params(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def _save(trainer: PolicyTrainer, root: Path, step: int, keep: int = 3) -> Path:
    return save_checkpoint(root, step=step, weight_version=step, model=trainer.model, optimizer=trainer.optimizer,
                           extra={"reward_mean": 0.5}, keep=keep, trainer_steps=trainer.steps, rl={"lr": 1e-3})


def test_a_resumed_trainer_takes_the_same_next_step_bit_for_bit(make_trainer: MakeTrainer, tmp_path: Path) -> None:
    original = make_trainer()
    _optimizer_step(original)
    _optimizer_step(original)
    _save(original, tmp_path, 2)
    _optimizer_step(original)
    expected = _params(original)

    resumed = make_trainer()
    _optimizer_step(resumed)
    assert any(not torch.equal(p, expected[n]) for n, p in _params(resumed).items())
    load_checkpoint(tmp_path, resumed.model, resumed.optimizer)
    _optimizer_step(resumed)
    after = _params(resumed)
    assert after.keys() == expected.keys()
    assert all(torch.equal(after[name], expected[name]) for name in expected)
    for name, param in resumed.model.named_parameters():
        mine, theirs = resumed.optimizer.state[param], original.optimizer.state[dict(original.model.named_parameters())[name]]
        assert all(torch.equal(mine[key], theirs[key]) for key in ("step", "exp_avg", "exp_avg_sq"))
        assert float(mine["step"]) == 3.0


def test_the_folder_holds_fp32_params_adamw_state_by_name_and_the_state_json(
    make_trainer: MakeTrainer, tmp_path: Path
) -> None:
    trainer = make_trainer()
    _optimizer_step(trainer)
    folder = _save(trainer, tmp_path, 1)
    with safe_open(str(folder / "policy.safetensors"), framework="pt") as policy:
        names = set(policy.keys())
        assert all(policy.get_tensor(n).dtype == torch.float32 for n in names)
    assert names == {name for name, _ in trainer.model.named_parameters()}
    with safe_open(str(folder / "optimizer.safetensors"), framework="pt") as optimizer:
        keys = set(optimizer.keys())
        layout = json.loads(optimizer.metadata()["rose.optimizer"])
    assert {f"state/{n}/{k}" for n in names for k in ("step", "exp_avg", "exp_avg_sq")} | {"rng/cpu"} == keys
    assert layout["class"] == "AdamW" and layout["groups"][0]["hyper"]["betas"] == [0.9, 0.999]
    state = read_state(folder)
    assert (state.step, state.trainer_steps, state.rl, state.extra) == (1, 0, {"lr": 1e-3}, {"reward_mean": 0.5})
    assert set(json.loads((folder / STATE_FILE).read_text())["rng"]) == {"python", "numpy"}


def test_resume_restores_the_torch_python_and_numpy_generators(make_trainer: MakeTrainer, tmp_path: Path) -> None:
    trainer = make_trainer()
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    _save(trainer, tmp_path, 1)
    expected = (torch.rand(4), random.random(), np.random.rand(2).tolist())
    torch.manual_seed(6)
    random.seed(6)
    np.random.seed(6)
    load_checkpoint(tmp_path / "step-000001", trainer.model, trainer.optimizer)
    drawn = (torch.rand(4), random.random(), np.random.rand(2).tolist())
    assert torch.equal(drawn[0], expected[0]) and drawn[1:] == expected[1:]


def test_keep_prunes_the_oldest_after_each_new_checkpoint(make_trainer: MakeTrainer, tmp_path: Path) -> None:
    trainer = make_trainer()
    for step in range(1, 4):
        _optimizer_step(trainer)
        _save(trainer, tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000002", "step-000003"]
    assert load_checkpoint(tmp_path, trainer.model, trainer.optimizer).step == 3


def test_another_model_is_refused_before_it_is_touched(
    make_trainer: MakeTrainer, models: ModelPaths, tmp_path: Path
) -> None:
    _save(make_trainer(), tmp_path, 1)
    other = make_trainer(models.serving)
    before = _params(other)
    with pytest.raises(CheckpointError, match=r"is of another model \(.*missing.*resume with the model"):
        load_checkpoint(tmp_path, other.model, other.optimizer)
    assert all(torch.equal(p, before[n]) for n, p in _params(other).items())


def test_another_optimizer_or_grouping_is_refused(make_trainer: MakeTrainer, tmp_path: Path) -> None:
    trainer = make_trainer()
    _save(trainer, tmp_path, 1)
    sgd = torch.optim.SGD(trainer.model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match="holds AdamW state, not SGD"):
        load_checkpoint(tmp_path, trainer.model, sgd)
    params = list(trainer.model.parameters())
    split = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:]}])
    with pytest.raises(CheckpointError, match="other optimizer parameter groups"):
        load_checkpoint(tmp_path, trainer.model, split)


def test_a_changed_learning_rate_comes_back_from_the_checkpoint(make_trainer: MakeTrainer, tmp_path: Path) -> None:
    trainer = make_trainer()
    trainer.optimizer.param_groups[0]["lr"] = 3e-4
    _save(trainer, tmp_path, 1)
    resumed = make_trainer()
    load_checkpoint(tmp_path, resumed.model, resumed.optimizer)
    group = resumed.optimizer.param_groups[0]
    assert group["lr"] == 3e-4 and group["betas"] == (0.9, 0.999)
