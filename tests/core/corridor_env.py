"""A second RL environment: a 1-D corridor, walk right to its exit. The tests install it as the plugin
distribution ``lake_plugin`` (``tests/core/conftest.py``), entry point ``corridor``; ``docs/rl.md`` shows it
(keep the two the same)."""

from __future__ import annotations

from rose_core.app.config import RLConfig
from rose_core.app.rl.environments.environment import StepOutcome

HEADER = "Corridor: walk to the exit at the far right. Answer with one move: left or right."


class CorridorEnv:
    def __init__(self, seed: int, length: int, max_turns: int) -> None:
        self.seed, self.length, self.max_turns, self.header = seed, length, max_turns, HEADER
        self.start = seed % (length - 1)  # never the exit
        self.reset()

    def reset(self) -> str:
        self.position, self.turns, self.done, self.success = self.start, 0, False, False
        return f"{HEADER}\ncell {self.position} of {self.length}. move:"

    def step(self, action_text: str) -> StepOutcome:
        words = action_text.lower().split()
        move = 1 if "right" in words else -1 if "left" in words else 0
        self.position = min(max(self.position + move, 0), self.length - 1)
        self.turns += 1
        self.success = self.position == self.length - 1
        self.done = self.success or self.turns >= self.max_turns
        reward = 1.0 if self.success else 0.0 if move else -0.1
        return StepOutcome(f"\ncell {self.position} of {self.length}. move:", reward, self.done, valid=move != 0)


def make_corridor(seed: int, rl: RLConfig) -> CorridorEnv:
    return CorridorEnv(seed, length=rl.env_size, max_turns=rl.max_turns)


NOT_A_FACTORY = "corridor"
