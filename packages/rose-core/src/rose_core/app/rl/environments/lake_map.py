"""A FrozenLake map: a square grid of cells with one start, one goal, some holes and a short safe path."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

FROZEN = "F"
HOLE = "H"
START = "S"
GOAL = "G"

Cell = tuple[int, int]

MOVES: dict[str, Cell] = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
"""Action word -> (row, column) displacement; the order is the action order of Gymnasium's FrozenLake."""

_ATTEMPTS = 64


@dataclass(slots=True, frozen=True)
class LakeMap:
    """``rows[r][c]`` is one of S, F, H, G. ``shortest_path`` counts the moves from start to goal."""

    rows: tuple[str, ...]
    start: Cell
    goal: Cell
    shortest_path: int

    @property
    def size(self) -> int:
        return len(self.rows)

    def cell(self, at: Cell) -> str:
        return self.rows[at[0]][at[1]]

    def inside(self, at: Cell) -> bool:
        return 0 <= at[0] < self.size and 0 <= at[1] < self.size


def generate_lake_map(seed: int, size: int = 4, max_path: int = 4, hole_ratio: float = 0.2) -> LakeMap:
    """A map drawn from ``seed`` whose goal is reachable from the start in at most ``max_path`` moves.

    Start and goal are placed at random at a Manhattan distance of 2..max_path (1 when only that fits),
    holes are drawn cell by cell; a draw whose goal is cut off is redrawn, and after a fixed number of
    tries the holes are dropped, so every seed yields a solvable map.
    """
    if size < 2:
        raise ValueError(f"lake size {size} is too small: use a size of at least 2")
    if max_path < 1:
        raise ValueError(f"max_path {max_path} must be at least 1: the goal must be reachable")
    if not 0.0 <= hole_ratio < 1.0:
        raise ValueError(f"hole_ratio {hole_ratio} must be in [0, 1)")
    rng = random.Random(seed)
    start, goal = _place_start_and_goal(rng, size, max_path)
    for _ in range(_ATTEMPTS):
        holes = {
            (r, c)
            for r in range(size)
            for c in range(size)
            if (r, c) not in (start, goal) and rng.random() < hole_ratio
        }
        path = _shortest_path(size, holes, start, goal)
        if path is not None and path <= max_path:
            return _build(size, holes, start, goal, path)
    return _build(size, set(), start, goal, manhattan(start, goal))


def _place_start_and_goal(rng: random.Random, size: int, max_path: int) -> tuple[Cell, Cell]:
    cells = [(r, c) for r in range(size) for c in range(size)]
    lowest = 2 if max_path >= 2 else 1
    start = rng.choice(cells)
    goals = [g for g in cells if lowest <= manhattan(start, g) <= max_path]
    return start, rng.choice(goals)


def manhattan(a: Cell, b: Cell) -> int:
    """Moves between two cells on an empty board."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _shortest_path(size: int, holes: set[Cell], start: Cell, goal: Cell) -> int | None:
    seen = {start: 0}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        if here == goal:
            return seen[here]
        for dr, dc in MOVES.values():
            there = (here[0] + dr, here[1] + dc)
            inside = 0 <= there[0] < size and 0 <= there[1] < size
            if inside and there not in holes and there not in seen:
                seen[there] = seen[here] + 1
                queue.append(there)
    return None


def _build(size: int, holes: set[Cell], start: Cell, goal: Cell, path: int) -> LakeMap:
    def symbol(at: Cell) -> str:
        if at == start:
            return START
        if at == goal:
            return GOAL
        return HOLE if at in holes else FROZEN

    rows = tuple("".join(symbol((r, c)) for c in range(size)) for r in range(size))
    return LakeMap(rows=rows, start=start, goal=goal, shortest_path=path)


def shortest_path_length(lake: LakeMap) -> int | None:
    """Moves from start to goal avoiding holes, or None when the goal is cut off (never for generated maps)."""
    holes = {(r, c) for r in range(lake.size) for c in range(lake.size) if lake.cell((r, c)) == HOLE}
    return _shortest_path(lake.size, holes, lake.start, lake.goal)
