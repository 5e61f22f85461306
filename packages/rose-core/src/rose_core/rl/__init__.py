"""The RL loop's pieces: a multi-turn environment, trajectories, GRPO, and (with ``rose-core[train]``) the tiny
models of the embedded demo and a reference trainer (``rose_core.rl.trainer``, imported on its own)."""

from rose_core.rl.conversation import Conversation, assemble_prompt
from rose_core.rl.episode import Episode
from rose_core.rl.frozenlake import FrozenLakeEnv, LakeRewards, StepOutcome, parse_action
from rose_core.rl.grpo import build_samples, group_advantages, normalize_group
from rose_core.rl.models import ModelPaths, ensure_models, load_tokenizer
from rose_core.rl.sample import TrainSample
from rose_core.rl.trajectory import Trajectory, Turn

__all__ = [
    "Conversation",
    "Episode",
    "FrozenLakeEnv",
    "LakeRewards",
    "ModelPaths",
    "StepOutcome",
    "TrainSample",
    "Trajectory",
    "Turn",
    "assemble_prompt",
    "build_samples",
    "ensure_models",
    "group_advantages",
    "load_tokenizer",
    "normalize_group",
    "parse_action",
]
