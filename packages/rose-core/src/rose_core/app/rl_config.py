"""The RL job's settings (`[rl]`): the steps and their rollout, the algorithm and its policy loss, evaluation,
checkpoints, and who trains."""

from __future__ import annotations

import math

import msgspec

from rose_core.config.sections import (
    ConfigSection,
    require_entry_point_name,
    require_non_negative,
    require_positive,
)

LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
"""How per-token losses become one number (``docs/rl.md``): over all tokens; per sample (turn) then over samples;
per-sample sums over a constant length (Dr. GRPO) then over samples."""


class AlgorithmPreset(msgspec.Struct, frozen=True):
    """What ``rl.algorithm`` fills into the fields left at 0 / empty."""

    clip_low: float
    clip_high: float
    loss_agg: str
    dynamic_sampling: bool = False


ALGORITHMS = {
    "grpo": AlgorithmPreset(clip_low=0.2, clip_high=0.2, loss_agg="seq_mean_token_mean"),
    "dapo": AlgorithmPreset(clip_low=0.2, clip_high=0.28, loss_agg="token_mean", dynamic_sampling=True),
}
"""GRPO as published (symmetric clip, per-sequence mean) and DAPO (decoupled clip-higher, token-level mean,
dynamic sampling)."""


def validate_policy_loss(*, clip_low: float, clip_high: float, loss_agg: str, kl_coef: float, tis_cap: float) -> None:
    """``ValueError`` naming the first policy-loss setting out of range (shared by ``RLConfig`` and the trainer)."""
    if not 0.0 < clip_low < 1.0:
        raise ValueError(f"`clip_low` {clip_low} must be in (0, 1): the ratio's floor is 1 - clip_low")
    if not (math.isfinite(clip_high) and clip_high >= clip_low):
        raise ValueError(
            f"`clip_high` {clip_high} must be >= `clip_low` {clip_low} (DAPO's clip-higher: e.g. 0.2 / 0.28)"
        )
    if loss_agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"`loss_agg` {loss_agg!r} is not one of {list(LOSS_AGGREGATIONS)}")
    if not (math.isfinite(kl_coef) and kl_coef >= 0.0):
        raise ValueError(f"`kl_coef` {kl_coef} must be >= 0 (0: no reference model)")
    if not (math.isfinite(tis_cap) and tis_cap >= 1.0):
        raise ValueError(f"`tis_cap` {tis_cap} must be >= 1 (a cap below 1 would down-weight on-policy tokens)")


EXTERNAL_TRAINER = "external"


TRAINERS = ("reference", EXTERNAL_TRAINER)


class LossConfig(ConfigSection):
    """`[rl.loss]`: the policy loss and reward shaping. Zero / empty values take the algorithm's (``ALGORITHMS``)."""

    clip_low: float = 0.0
    """PPO clip below: the ratio new/proximal is kept >= 1 - clip_low. 0: the algorithm's (0.2)."""
    clip_high: float = 0.0
    """PPO clip above: the ratio is kept <= 1 + clip_high. 0: the algorithm's (grpo 0.2, dapo 0.28)."""
    loss_agg: str = ""
    """One of ``LOSS_AGGREGATIONS``. Empty: the algorithm's (grpo ``seq_mean_token_mean``, dapo ``token_mean``)."""
    advantage_std_norm: bool = True
    """Divide group-centred rewards by the group's std (GRPO, DAPO); false for Dr. GRPO."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to a frozen copy of the initial policy, per token; 0: no reference model."""
    tis_cap: float = 2.0
    """Cap of the truncated importance weight proximal/behaviour that corrects turns sampled on older weights."""
    overlong_buffer_tokens: int = 0
    """DAPO's soft overlong punishment, per turn: a turn within this many tokens of ``rl.max_tokens_per_turn``
    is penalised linearly up to ``overlong_penalty``. 0: off."""
    overlong_penalty: float = 1.0
    """The penalty of a turn that reaches ``rl.max_tokens_per_turn`` (with ``overlong_buffer_tokens`` > 0)."""

    def __post_init__(self) -> None:
        require_non_negative(overlong_buffer_tokens=self.overlong_buffer_tokens, overlong_penalty=self.overlong_penalty)


class SamplingConfig(ConfigSection):
    """`[rl.sampling]`: how turns are sampled and which groups are kept."""

    temperature: float = 1.0
    dynamic_sampling: bool | None = None
    """DAPO's dynamic sampling: drop groups whose rewards are all equal (no gradient) and roll out new groups
    in their place, at most ``max_refill_rounds`` times a step. None: the algorithm's (dapo on, grpo off)."""
    max_refill_rounds: int = 2
    """Refill rounds of dynamic sampling per step (the step trains on what it has after the last)."""

    def __post_init__(self) -> None:
        require_non_negative(temperature=self.temperature, max_refill_rounds=self.max_refill_rounds)


class EvalConfig(ConfigSection):
    """`[rl.eval]`: held-out maps played greedily (temperature 0) beside a step's rollout, never trained on."""

    every: int = 6
    """Every this many steps, and on the first step (the weights before any update) and the last (``eval_success``
    in the report); 0: never."""
    maps: int = 8
    """Held-out maps per evaluation (their seeds never occur in training)."""

    def __post_init__(self) -> None:
        require_non_negative(every=self.every)
        require_positive(maps=self.maps)


class CheckpointConfig(ConfigSection):
    """`[rl.checkpoint]`: policy, optimizer, step, RNG and weight version, written whole or not at all."""

    every: int = 0
    """Every this many steps (and after the last); 0: never."""
    dir: str = ""
    """Where checkpoints go; empty: ``<run_dir>/checkpoints``."""
    keep: int = 3
    """Complete checkpoints kept (older ones are deleted once a new one is written)."""

    def __post_init__(self) -> None:
        require_non_negative(every=self.every)
        require_positive(keep=self.keep)


class TrainerConfig(ConfigSection):
    """`[rl.trainer]`: who trains, and how."""

    kind: str = "reference"
    """``reference`` (ROSE's trainer, in the controller's process) or ``external`` (your trainer pulls each
    step's batch from the trainer API and publishes the next version itself; docs/gateway.md, "External
    trainers")."""
    lr: float = 3e-3
    epochs: int = 2
    ranks: int = 1
    """External trainers: the tensor-parallel ranks that each publish their shard of a version."""
    timeout_s: float = 1800.0
    """External trainers: a step whose next version has not been published by then fails the run."""
    key_file: str = ""
    """External trainers: the bearer key of the trainer API (never the agents' gateway key, which gets a 403
    there); empty: ``<run_dir>/trainer.key``, made 0600 on the first start and kept."""

    def __post_init__(self) -> None:
        if self.kind not in TRAINERS:
            raise ValueError(f"`kind` {self.kind!r} is not one of {list(TRAINERS)}")
        require_positive(lr=self.lr, epochs=self.epochs, ranks=self.ranks, timeout_s=self.timeout_s)

    @property
    def external(self) -> bool:
        return self.kind == EXTERNAL_TRAINER


class RLConfig(ConfigSection):
    """The RL job. The defaults are the README demo's, chosen so that it visibly learns within a few minutes
    on 2 cores (`tools/learning_sweep.py`, `docs/rl_sweep.md`; measured live: `docs/rl.md`)."""

    steps: int = 18
    prompts_per_step: int = 3
    group_size: int = 4
    max_turns: int = 4
    max_tokens_per_turn: int = 8
    max_context_tokens: int = 512
    env_size: int = 4
    seed: int = 0
    turn_timeout_s: float = 120.0
    weight_sync_timeout_s: float = 120.0
    algorithm: str = "dapo"
    """``grpo`` or ``dapo``: the defaults of ``[rl.loss]`` clip_low, clip_high and loss_agg and of
    ``[rl.sampling]`` dynamic_sampling (``ALGORITHMS``)."""
    env: str = "frozenlake"
    """The environment played: a built-in (``frozenlake``), a ``rose.environments`` entry point of an
    installed package (``rose_core.app.rl.environments.registry``; resolved when the job starts), or ``gateway``: agents
    bring their own turns through the rollout gateway (``[gateway]``)."""
    loss: LossConfig = msgspec.field(default_factory=LossConfig)
    sampling: SamplingConfig = msgspec.field(default_factory=SamplingConfig)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = msgspec.field(default_factory=CheckpointConfig)
    trainer: TrainerConfig = msgspec.field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        require_positive(
            steps=self.steps, prompts_per_step=self.prompts_per_step, group_size=self.group_size,
            max_turns=self.max_turns, max_tokens_per_turn=self.max_tokens_per_turn,
            max_context_tokens=self.max_context_tokens, env_size=self.env_size, turn_timeout_s=self.turn_timeout_s,
            weight_sync_timeout_s=self.weight_sync_timeout_s,
        )
        if self.group_size < 2:
            raise ValueError("`group_size` must be >= 2 (GRPO normalises rewards within a group)")
        self._apply_algorithm()
        loss = self.loss
        validate_policy_loss(clip_low=loss.clip_low, clip_high=loss.clip_high, loss_agg=loss.loss_agg,
                             kl_coef=loss.kl_coef, tis_cap=loss.tis_cap)
        if loss.overlong_buffer_tokens > self.max_tokens_per_turn:
            raise ValueError(
                f"`overlong_buffer_tokens` {loss.overlong_buffer_tokens} must be <= `max_tokens_per_turn` "
                f"{self.max_tokens_per_turn}: the buffer is the last part of a turn's token budget"
            )
        if self.trainer.external and self.checkpoint.every:
            raise ValueError("`checkpoint.every` needs ROSE's trainer: an external trainer checkpoints itself "
                             "(set it to 0)")
        require_entry_point_name(env=self.env)

    def _apply_algorithm(self) -> None:
        preset = ALGORITHMS.get(self.algorithm)
        if preset is None:
            raise ValueError(f"`algorithm` {self.algorithm!r} is not one of {list(ALGORITHMS)}")
        loss = self.loss
        loss.clip_low = loss.clip_low or preset.clip_low
        loss.clip_high = loss.clip_high or preset.clip_high
        loss.loss_agg = loss.loss_agg or preset.loss_agg
        if self.sampling.dynamic_sampling is None:
            self.sampling.dynamic_sampling = preset.dynamic_sampling


RL_MOVED = {
    **{f"rl.{name}": f"rl.loss.{name}" for name in ("clip_low", "clip_high", "loss_agg", "advantage_std_norm",
                                                     "kl_coef", "tis_cap", "overlong_buffer_tokens",
                                                     "overlong_penalty")},
    **{f"rl.{name}": f"rl.sampling.{name}" for name in ("temperature", "dynamic_sampling", "max_refill_rounds")},
    "rl.eval_every": "rl.eval.every", "rl.eval_maps": "rl.eval.maps",
    "rl.checkpoint_every": "rl.checkpoint.every", "rl.checkpoint_dir": "rl.checkpoint.dir",
    "rl.checkpoint_keep": "rl.checkpoint.keep",
    "rl.lr": "rl.trainer.lr", "rl.epochs": "rl.trainer.epochs", "rl.trainer_ranks": "rl.trainer.ranks",
    "rl.trainer_timeout_s": "rl.trainer.timeout_s", "rl.trainer": "rl.trainer.kind",
}
"""Old flat `[rl]` names (before its sections) -> their place now (``rl.trainer`` as a string: now the
``[rl.trainer]`` table's ``kind``)."""
