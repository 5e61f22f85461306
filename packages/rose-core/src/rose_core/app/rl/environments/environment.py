"""What an RL environment is to ROSE: the ``Environment`` an ``Episode`` drives, and the ``EnvironmentFactory``
that a plugin registers in the entry-point group ``rose.environments`` (``rose_core.app.rl.environments.registry``).

An environment is text in, text out: the policy reads observations and answers in free text, the environment
parses the answer, moves on and pays a reward. It is pure Python, deterministic from its seed, and reads no
clock: ROSE steps thousands of them from one controller thread, so ``step`` must return quickly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rose_core.app.config import RLConfig


@dataclass(slots=True, frozen=True)
class StepOutcome:
    """What one ``step`` returns."""

    observation: str
    """The text the policy reads next (appended to the conversation after its response)."""
    reward: float
    """This turn's reward (a trajectory's return is the sum over its turns)."""
    done: bool
    """The episode is over: no further turn is sampled."""
    valid: bool
    """The response was a well-formed action (reported, not used by the trainer)."""


class Environment(Protocol):
    """One episode of a multi-turn text task, as ``rose_core.app.rl.environments.episode.Episode`` drives it:
    ``reset()`` once, then ``step(response)`` until an outcome says ``done``, then ``success`` is read."""

    @property
    def seed(self) -> int:
        """The seed the episode was made from (recorded with the trajectory; the same seed, the same task)."""
        ...

    @property
    def header(self) -> str:
        """The instructions: the start of ``reset()``'s observation, kept when a long prompt is truncated."""
        ...

    @property
    def done(self) -> bool:
        """The episode is over."""
        ...

    @property
    def success(self) -> bool:
        """The task was solved (the trajectory's success; read once ``done``)."""
        ...

    def reset(self) -> str:
        """Start the episode; the first observation, which starts with ``header``."""
        ...

    def step(self, action_text: str) -> StepOutcome:
        """Apply the policy's response (decoded text, end-of-sequence token removed)."""
        ...


class EnvironmentFactory(Protocol):
    """Makes the episode of ``seed``, reading what it needs from the ``[rl]`` section (``max_turns``, ...).

    The RL job calls it once per trajectory (a group's trajectories share a seed) and for the held-out
    evaluation episodes (seeds from ``rose_core.app.jobs.rl_job.EVAL_SEED_BASE``)."""

    def __call__(self, seed: int, rl: RLConfig) -> Environment: ...
