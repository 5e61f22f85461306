"""FrozenLake as a text environment: solvable maps, action parsing, rewards, episode limits."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rose_core.app.config import RLConfig
from rose_core.app.rl.environments.frozenlake import (
    ACTION_WORDS,
    HEADER,
    PROMPT_TAIL,
    FrozenLakeEnv,
    LakeRewards,
    make_frozenlake,
    parse_action,
)
from rose_core.app.rl.environments.lake_map import GOAL, HOLE, START, generate_lake_map, manhattan, shortest_path_length


@given(seed=st.integers(0, 2**32), size=st.integers(2, 8), max_turns=st.integers(1, 12))
def test_generated_maps_are_solvable_within_max_turns(seed: int, size: int, max_turns: int) -> None:
    lake = generate_lake_map(seed, size=size, max_path=max_turns)
    flat = "".join(lake.rows)
    assert len(lake.rows) == size and all(len(row) == size for row in lake.rows)
    assert flat.count(START) == 1 and flat.count(GOAL) == 1
    assert lake.cell(lake.start) == START and lake.cell(lake.goal) == GOAL
    path = shortest_path_length(lake)
    assert path is not None and path == lake.shortest_path <= max_turns
    assert manhattan(lake.start, lake.goal) >= min(2, max_turns)


def test_maps_are_deterministic_and_varied() -> None:
    assert generate_lake_map(7) == generate_lake_map(7)
    maps = {generate_lake_map(seed).rows for seed in range(50)}
    assert len(maps) > 40
    assert any(HOLE in "".join(rows) for rows in maps)


def test_map_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="size"):
        generate_lake_map(0, size=1)
    with pytest.raises(ValueError, match="max_path"):
        generate_lake_map(0, max_path=0)
    with pytest.raises(ValueError, match="max_turns"):
        FrozenLakeEnv(0, max_turns=0)


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("left", "left"),
        (" I go UP then left", "up"),
        ("move: Right.", "right"),
        ("down,up", "down"),
        ("upward leftover", None),
        ("", None),
        ("stay", None),
    ],
)
def test_parse_action_takes_the_first_whole_action_word(text: str, action: str | None) -> None:
    assert parse_action(text) == action


def test_reset_renders_header_board_and_prompt() -> None:
    env = FrozenLakeEnv(seed=3)
    observation = env.reset()
    assert observation.startswith(env.header) and env.header == HEADER
    assert observation.endswith(PROMPT_TAIL)
    board = observation.split("\n")[1:5]
    assert len(board) == 4 and sum(row.split().count("P") for row in board) == 1


def _step_towards(env: FrozenLakeEnv, target: tuple[int, int]) -> str:
    (r, c), (tr, tc) = env.position, target
    if tr != r:
        return "down" if tr > r else "up"
    return "right" if tc > c else "left"


def test_invalid_action_does_not_move_and_is_penalized() -> None:
    env = FrozenLakeEnv(seed=1)
    env.reset()
    outcome = env.step("hello there")
    assert not outcome.valid and outcome.reward == LakeRewards().invalid < 0
    assert env.position == env.lake.start and not outcome.done
    assert "no move found." in outcome.observation


def test_walking_a_shortest_path_reaches_the_goal() -> None:
    for seed in range(30):
        env = FrozenLakeEnv(seed=seed, max_turns=6)
        env.reset()
        path = _safe_path(env)
        outcomes = [env.step(action) for action in path]
        assert outcomes[-1].done and outcomes[-1].reward == 1.0 and env.success and env.reached_goal
        assert all(o.valid and round(o.reward, 6) in (0.05, 0.15) for o in outcomes[:-1])
        assert "goal" in outcomes[-1].observation and not outcomes[-1].observation.endswith(PROMPT_TAIL)


def _safe_path(env: FrozenLakeEnv) -> list[str]:
    """Breadth-first moves from start to goal avoiding holes."""
    lake, start = env.lake, env.lake.start
    moves = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
    frontier, came = [start], {start: (start, "")}
    while frontier:
        here = frontier.pop(0)
        for word, (dr, dc) in moves.items():
            there = (here[0] + dr, here[1] + dc)
            if lake.inside(there) and there not in came and lake.cell(there) != HOLE:
                came[there] = (here, word)
                frontier.append(there)
    path, at = [], lake.goal
    while at != start:
        at, word = came[at]
        path.append(word)
    return path[::-1]


def test_falling_into_a_hole_ends_with_zero() -> None:
    for seed in range(200):
        env = FrozenLakeEnv(seed=seed)
        env.reset()
        r, c = env.lake.start
        for word, (dr, dc) in {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}.items():
            if env.lake.inside((r + dr, c + dc)) and env.lake.cell((r + dr, c + dc)) == HOLE:
                outcome = env.step(word)
                assert outcome.done and outcome.valid and outcome.reward == 0.0
                assert "hole" in outcome.observation
                return
    pytest.fail("no map with a hole next to the start in 200 seeds")


def test_falling_into_a_hole_or_running_out_of_moves_is_no_success() -> None:
    env = FrozenLakeEnv(seed=2, max_turns=2)
    env.reset()
    while not env.done:
        env.step("nothing")
    assert not env.success and not env.reached_goal


def test_the_factory_reads_the_map_size_and_the_move_budget_from_the_rl_section() -> None:
    env = make_frozenlake(9, RLConfig(env_size=5, max_turns=6))
    assert (env.seed, len(env.lake.rows), env.max_turns) == (9, 5, 6)
    assert env.lake == FrozenLakeEnv(seed=9, size=5, max_turns=6).lake


def test_wall_bump_is_valid_and_stays() -> None:
    env = FrozenLakeEnv(seed=0, size=2, max_turns=1)
    env.reset()
    r, c = env.position
    word = "up" if r == 0 else "down"
    outcome = env.step(word)
    assert outcome.valid and env.position == (r, c) and outcome.reward == LakeRewards().valid


def test_episode_ends_after_max_turns_and_rejects_more_steps() -> None:
    env = FrozenLakeEnv(seed=2, max_turns=3)
    env.reset()
    outcomes = [env.step("nothing") for _ in range(3)]
    assert [o.done for o in outcomes] == [False, False, True]
    assert "out of moves." in outcomes[-1].observation
    with pytest.raises(ValueError, match="reset"):
        env.step("left")
    env.reset()
    assert not env.done and env.turns == 0


def test_random_answers_give_spread_out_group_rewards() -> None:
    """A group (same map) of random answers, a quarter of them valid moves, gets non-constant rewards."""
    rng = random.Random(0)
    answers = [*ACTION_WORDS, "xq", "hm ok", "?", "zz", "the", "no", "a b", "lo", "vv", "..", "k"]
    for seed in range(20):
        totals = []
        for _ in range(8):
            env = FrozenLakeEnv(seed=seed)
            env.reset()
            total, done = 0.0, False
            while not done:
                outcome = env.step(rng.choice(answers))
                total, done = total + outcome.reward, outcome.done
            totals.append(round(total, 6))
        assert len(set(totals)) > 1, f"constant rewards {totals} for seed {seed}"


def test_rewards_are_validated() -> None:
    with pytest.raises(ValueError, match="goal"):
        LakeRewards(goal=0.1)
    with pytest.raises(ValueError, match="penalty"):
        LakeRewards(invalid=0.5)
