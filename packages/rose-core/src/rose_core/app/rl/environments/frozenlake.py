"""FrozenLake as a multi-turn text environment: the board is rendered in the prompt, the move is parsed from
the generated text. Pure Python, deterministic from its seed, no clock."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rose_core.app.rl.environments.environment import StepOutcome
from rose_core.app.rl.environments.lake_map import GOAL, HOLE, MOVES, Cell, LakeMap, generate_lake_map, manhattan

if TYPE_CHECKING:
    from rose_core.app.config import RLConfig

ACTION_WORDS: tuple[str, ...] = tuple(MOVES)
"""The words a response may contain; the first one found is the move."""

PLAYER = "P"
HEADER = "FrozenLake: walk on F to the goal G and avoid the holes H. You are P. Answer with one move: left, down, right or up."
PROMPT_TAIL = "move:"
FEEDBACK = {
    "invalid": "no move found.",
    "wall": "you hit the wall.",
    "goal": "you reached the goal!",
    "hole": "you fell into a hole.",
    "out": "out of moves.",
    "moved": "you moved {action}.",
}
_ACTION_PATTERN = re.compile(r"\b(" + "|".join(ACTION_WORDS) + r")\b", re.IGNORECASE)


@dataclass(slots=True, frozen=True)
class LakeRewards:
    """Per-step rewards. Shaping keeps a random policy's returns spread out within a group."""

    goal: float = 1.0
    hole: float = 0.0
    valid: float = 0.05
    closer: float = 0.1
    invalid: float = -0.05

    def __post_init__(self) -> None:
        if self.goal <= max(self.valid + self.closer, self.hole):
            raise ValueError(f"goal reward {self.goal} must exceed every other step reward: raise it")
        if self.invalid > 0.0:
            raise ValueError(f"invalid-action reward {self.invalid} must not be positive: use a penalty <= 0")


def rendered_words_text() -> str:
    """Every fixed piece of text an observation can contain: a tokenizer must know all of its words."""
    cells = " ".join([*"SFHG", PLAYER])
    fixed = [text for key, text in FEEDBACK.items() if key != "moved"]
    moved = [FEEDBACK["moved"].format(action=action) for action in ACTION_WORDS]
    return "\n".join([HEADER, cells, PROMPT_TAIL, *fixed, *moved])


def parse_action(text: str) -> str | None:
    """The first action word in ``text`` (case-insensitive, whole words), or None."""
    found = _ACTION_PATTERN.search(text)
    return found.group(1).lower() if found else None


class FrozenLakeEnv:
    """One episode on one map. ``reset()`` gives the first observation, which starts with ``HEADER``."""

    __slots__ = ("_done", "_position", "_turns", "lake", "max_turns", "rewards", "seed")

    def __init__(self, seed: int, size: int = 4, max_turns: int = 4, rewards: LakeRewards | None = None) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns {max_turns} must be at least 1")
        self.seed = seed
        self.max_turns = max_turns
        self.rewards = rewards if rewards is not None else LakeRewards()
        self.lake: LakeMap = generate_lake_map(seed, size=size, max_path=max_turns)
        self._position: Cell = self.lake.start
        self._turns = 0
        self._done = False

    @property
    def header(self) -> str:
        """The instructions every first observation starts with (kept when a long prompt is truncated)."""
        return HEADER

    @property
    def position(self) -> Cell:
        return self._position

    @property
    def turns(self) -> int:
        return self._turns

    @property
    def done(self) -> bool:
        return self._done

    @property
    def reached_goal(self) -> bool:
        """The player stands on the goal (the episode's success)."""
        return self.lake.cell(self._position) == GOAL

    @property
    def success(self) -> bool:
        """The episode's success (``Environment.success``): the goal was reached."""
        return self.reached_goal

    def reset(self) -> str:
        self._position = self.lake.start
        self._turns = 0
        self._done = False
        return f"{HEADER}\n{self.render()}\n{PROMPT_TAIL}"

    def render(self) -> str:
        """The board, one row per line, cells separated by spaces, the player shown as P."""
        lines = []
        for r, row in enumerate(self.lake.rows):
            cells = [PLAYER if (r, c) == self._position else symbol for c, symbol in enumerate(row)]
            lines.append(" ".join(cells))
        return "\n".join(lines)

    def step(self, action_text: str) -> StepOutcome:
        if self._done:
            raise ValueError("the episode is over: call reset() before stepping again")
        self._turns += 1
        action = parse_action(action_text)
        if action is None:
            return self._outcome(FEEDBACK["invalid"], self.rewards.invalid, valid=False)
        return self._move(action)

    def _move(self, action: str) -> StepOutcome:
        dr, dc = MOVES[action]
        target = (self._position[0] + dr, self._position[1] + dc)
        if not self.lake.inside(target):
            return self._outcome(FEEDBACK["wall"], self.rewards.valid, valid=True)
        closer = manhattan(target, self.lake.goal) < manhattan(self._position, self.lake.goal)
        self._position = target
        cell = self.lake.cell(target)
        if cell == GOAL:
            self._done = True
            return self._outcome(FEEDBACK["goal"], self.rewards.goal, valid=True)
        if cell == HOLE:
            self._done = True
            return self._outcome(FEEDBACK["hole"], self.rewards.hole, valid=True)
        reward = self.rewards.valid + (self.rewards.closer if closer else 0.0)
        return self._outcome(FEEDBACK["moved"].format(action=action), reward, valid=True)

    def _outcome(self, feedback: str, reward: float, *, valid: bool) -> StepOutcome:
        if not self._done and self._turns >= self.max_turns:
            self._done = True
            feedback = f"{feedback} {FEEDBACK['out']}"
        tail = "" if self._done else f"\n{PROMPT_TAIL}"
        observation = f"\n{feedback}\n{self.render()}{tail}"
        return StepOutcome(observation=observation, reward=reward, done=self._done, valid=valid)


def make_frozenlake(seed: int, rl: RLConfig) -> FrozenLakeEnv:
    """The ``rose.environments`` entry ``frozenlake``: a ``rl.env_size`` square map, ``rl.max_turns`` moves."""
    return FrozenLakeEnv(seed=seed, size=rl.env_size, max_turns=rl.max_turns)
