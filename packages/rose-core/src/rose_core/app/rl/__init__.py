"""The RL loop's pieces: the environment protocol and its registry (FrozenLake built in), trajectories,
GRPO / DAPO advantages, shaping and filters, the policy loss's settings, and (with ``rose-core[train]``) the tiny
models of the embedded demo and a reference trainer (``rose_core.app.rl.trainer.trainer``, imported on its own, with its loss
in ``rose_core.app.rl.algorithm.policy_loss``)."""

from rose_core.app.rl.algorithm.grpo import (
    build_samples,
    build_samples_from_config,
    group_advantages,
    informative_groups,
    normalize_group,
)
from rose_core.app.rl.algorithm.loss_settings import LossSettings
from rose_core.app.rl.algorithm.overlong import OverlongShaping, overlong_shaping
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory import Trajectory, Turn
from rose_core.app.rl.demo.models import ModelPaths, ensure_models, load_tokenizer
from rose_core.app.rl.environments.conversation import Conversation, assemble_prompt
from rose_core.app.rl.environments.environment import Environment, EnvironmentFactory, StepOutcome
from rose_core.app.rl.environments.episode import Episode
from rose_core.app.rl.environments.frozenlake import FrozenLakeEnv, LakeRewards, make_frozenlake, parse_action
from rose_core.app.rl.environments.registry import load_environment

__all__ = [
    "Conversation",
    "Environment",
    "EnvironmentFactory",
    "Episode",
    "FrozenLakeEnv",
    "LakeRewards",
    "LossSettings",
    "ModelPaths",
    "OverlongShaping",
    "StepOutcome",
    "TrainSample",
    "Trajectory",
    "Turn",
    "assemble_prompt",
    "build_samples",
    "build_samples_from_config",
    "ensure_models",
    "group_advantages",
    "informative_groups",
    "load_environment",
    "load_tokenizer",
    "make_frozenlake",
    "normalize_group",
    "overlong_shaping",
    "parse_action",
]
