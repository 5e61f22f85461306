"""One sequence per trajectory: a trajectory's turns in one row (``packed_batch``) give the trainer the same
loss as one row per turn, for every loss aggregation, with importance weights, per-turn advantages and
temperatures in play; a turn whose prompt does not extend the previous turn starts a new row."""

from __future__ import annotations

import random

import pytest

from rose_core.app.rl.algorithm.loss_settings import LossSettings
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory_rows import rows_of
from rose_core.app.rl.demo.models import ModelPaths
from rose_core.app.rl.trainer.trainer import PolicyTrainer


def trajectory(name: str, turns: int, rng: random.Random, *, rewritten_at: int | None = None) -> list[TrainSample]:
    """``turns`` turns whose prompts grow by the previous response and a new observation (random ids of the
    tiny policy's vocabulary); at ``rewritten_at`` the history is rewritten (a new prompt)."""
    prompt: tuple[int, ...] = tuple(rng.randrange(8, 150) for _ in range(12))
    samples = []
    for index in range(turns):
        if index == rewritten_at:
            prompt = tuple(rng.randrange(8, 150) for _ in range(20))
        response = tuple(rng.randrange(8, 150) for _ in range(rng.randint(2, 6)))
        behaviour = tuple(-rng.uniform(2.0, 7.0) for _ in response)
        samples.append(TrainSample(name, index, prompt, response, behaviour, 0, rng.uniform(-1.5, 1.5),
                                   temperature=rng.choice([1.0, 0.7]), top_p=rng.choice([1.0, 0.9])))
        prompt = prompt + response + tuple(rng.randrange(8, 150) for _ in range(rng.randint(3, 8)))
    return samples


def batch(rng: random.Random) -> list[TrainSample]:
    return [*trajectory("a", 10, rng), *trajectory("b", 10, rng, rewritten_at=6), *trajectory("c", 4, rng)]


def test_turns_that_extend_each_other_share_a_row_and_a_rewrite_starts_another() -> None:
    samples = batch(random.Random(0))
    rows = rows_of(samples, pack=True)
    assert [[s.turn_index for s in row] for row in rows] == [list(range(10)), list(range(6)), [6, 7, 8, 9],
                                                              list(range(4))]
    assert len(rows_of(samples, pack=False)) == len(samples)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_one_sequence_per_trajectory_gives_the_per_turn_loss(models: ModelPaths, loss_agg: str) -> None:
    samples = batch(random.Random(1))
    settings = LossSettings(loss_agg=loss_agg, max_response_tokens=8)
    packed = PolicyTrainer(models.policy, epochs=1, loss=settings, pack=True).train_step(samples)
    per_turn = PolicyTrainer(models.policy, epochs=1, loss=settings, pack=False).train_step(samples)
    assert packed.loss == pytest.approx(per_turn.loss, abs=1e-5)
    assert packed.tokens == per_turn.tokens and packed.samples == per_turn.samples == len(samples)
    assert packed.grad_norm == pytest.approx(per_turn.grad_norm, rel=1e-4)
    assert packed.behaviour_ratio_mean == pytest.approx(per_turn.behaviour_ratio_mean, rel=1e-5)
