"""GRPO advantages, samples, trajectory records and multi-turn prompt assembly (all torch-free)."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rose_core.app.config import RLConfig
from rose_core.app.rl import (
    Conversation,
    Episode,
    FrozenLakeEnv,
    OverlongShaping,
    Trajectory,
    Turn,
    assemble_prompt,
    build_samples,
    build_samples_from_config,
    group_advantages,
    informative_groups,
    normalize_group,
    overlong_shaping,
)
from rose_core.app.rl.environments.frozenlake import HEADER
from rose_core.app.rl_config import LossConfig

rewards_strategy = st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=32)


@given(rewards_strategy)
def test_group_advantages_have_zero_mean_and_unit_scale(rewards: list[float]) -> None:
    advantages = normalize_group(rewards)
    assert len(advantages) == len(rewards)
    assert abs(math.fsum(advantages)) <= 1e-6 * len(rewards)
    if max(rewards) == min(rewards):
        assert advantages == [0.0] * len(rewards)
    else:
        spread = math.sqrt(math.fsum(a * a for a in advantages) / len(advantages))
        assert spread <= 1.0 + 1e-9
        order = sorted(range(len(rewards)), key=rewards.__getitem__)
        assert all(advantages[i] <= advantages[j] + 1e-12 for i, j in itertools.pairwise(order))


@given(st.floats(-5, 5, allow_nan=False), st.integers(1, 16))
def test_constant_groups_get_zero_advantage(reward: float, size: int) -> None:
    assert normalize_group([reward] * size) == [0.0] * size


def test_normalize_group_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="finite"):
        normalize_group([0.0, math.nan])
    with pytest.raises(ValueError, match="eps"):
        normalize_group([0.0, 1.0], eps=0.0)


def _turn(reward: float = 0.0, version: int = 0) -> Turn:
    return Turn((1, 2, 3), (4, 5), (-0.5, -1.5), weight_version=version, reward=reward)


def _trajectory(tid: str, group: str, rewards: Sequence[float]) -> Trajectory:
    trajectory = Trajectory(trajectory_id=tid, group_id=group, env_seed=0)
    for reward in rewards:
        trajectory.add_turn(_turn(reward))
    trajectory.finish()
    return trajectory


def test_group_advantages_normalize_within_each_group() -> None:
    trajectories = [
        _trajectory("a", "g1", [1.0]),
        _trajectory("b", "g1", [0.0, 0.0]),
        _trajectory("c", "g2", [0.5]),
        _trajectory("d", "g2", [0.25, 0.25]),
    ]
    advantages = group_advantages(trajectories)
    assert advantages["a"] == pytest.approx(1.0, abs=1e-5) and advantages["b"] == pytest.approx(-1.0, abs=1e-5)
    assert advantages["c"] == 0.0 and advantages["d"] == 0.0
    with pytest.raises(ValueError, match="twice"):
        group_advantages([*trajectories, _trajectory("a", "g1", [0.3])])


def test_build_samples_gives_one_sample_per_turn_with_its_trajectory_advantage() -> None:
    trajectories = [_trajectory("a", "g", [0.5, 0.5]), _trajectory("b", "g", [0.0]), _trajectory("c", "h", [1.0])]
    samples = build_samples(trajectories)
    assert [(s.trajectory_id, s.turn_index) for s in samples] == [("a", 0), ("a", 1), ("b", 0), ("c", 0)]
    assert samples[0].advantage == samples[1].advantage > 0 > samples[2].advantage
    assert samples[3].advantage == 0.0
    assert samples[0].response_token_ids == (4, 5) and samples[0].behaviour_logprobs == (-0.5, -1.5)
    assert [s.trajectory_id for s in build_samples(trajectories, skip_zero_advantage=True)] == ["a", "a", "b"]


def test_dr_grpo_advantages_are_centred_but_not_scaled() -> None:
    # mean 0.5; std sqrt((0.25 + 0.25 + 0) / 3) = 0.408248
    assert normalize_group([1.0, 0.0, 0.5], std_norm=False) == pytest.approx([0.5, -0.5, 0.0])
    assert normalize_group([1.0, 0.0, 0.5]) == pytest.approx([1.224742, -1.224742, 0.0], abs=1e-5)
    assert normalize_group([0.3, 0.3], std_norm=False) == [0.0, 0.0]
    trajectories = [_trajectory("a", "g", [2.0]), _trajectory("b", "g", [0.0])]
    assert group_advantages(trajectories, std_norm=False) == {"a": 1.0, "b": -1.0}


def test_overlong_shaping_values() -> None:
    # budget 8, buffer 4: free up to 8 - 4 = 4 tokens, then (4 - L) / 4 * penalty down to -penalty at 8
    assert [overlong_shaping(n, 8, 4, 1.0) for n in (0, 4, 5, 6, 7, 8, 9)] == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    assert overlong_shaping(6, 8, 4, 0.5) == -0.25
    assert overlong_shaping(8, 8, 0, 1.0) == 0.0  # buffer 0: off
    assert overlong_shaping(2, 8, 8, 1.0) == -0.25  # the whole budget as buffer: (0 - 2) / 8
    with pytest.raises(ValueError, match="buffer 9"):
        overlong_shaping(1, 8, 9, 1.0)
    with pytest.raises(ValueError, match=r"penalty -1\.0"):
        overlong_shaping(1, 8, 4, -1.0)
    with pytest.raises(ValueError, match="length -1"):
        overlong_shaping(-1, 8, 4, 1.0)
    with pytest.raises(ValueError, match="max_length 0"):
        OverlongShaping(0, 0)


def test_overlong_shaping_is_per_turn_and_enters_the_advantage() -> None:
    # every _turn has 2 response tokens: at the budget 2 (buffer 1) each turn is shaped by -1
    shaping = OverlongShaping(max_length=2, buffer=1, penalty=1.0)
    assert shaping.shaped_reward(_trajectory("a", "g", [0.5, 0.5])) == -1.0  # 1.0 - 2 * 1
    assert OverlongShaping(max_length=4, buffer=1).shaped_reward(_trajectory("a", "g", [0.5])) == 0.5  # 2 <= 3
    # equal rewards, but b took two full-budget turns to a's one: shaped -1 vs -2, centred +-0.5
    trajectories = [_trajectory("a", "g", [0.0]), _trajectory("b", "g", [0.0, 0.0])]
    assert group_advantages(trajectories, std_norm=False, overlong=shaping) == {"a": 0.5, "b": -0.5}
    assert group_advantages(trajectories) == {"a": 0.0, "b": 0.0}


def test_build_samples_from_config_applies_the_jobs_advantage_settings() -> None:
    trajectories = [_trajectory("a", "g", [1.0]), _trajectory("b", "g", [0.0, 0.0])]
    plain = build_samples_from_config(trajectories, RLConfig())
    assert [s.advantage for s in plain] == pytest.approx([1.0, -1.0, -1.0], abs=1e-5)
    rl = RLConfig(max_tokens_per_turn=2,
                  loss=LossConfig(advantage_std_norm=False, overlong_buffer_tokens=1, overlong_penalty=0.5))
    # shaped: a 1.0 - 0.5 = 0.5, b 0.0 - 2 * 0.5 = -1.0; mean -0.25; centred 0.75, -0.75
    assert [s.advantage for s in build_samples_from_config(trajectories, rl)] == pytest.approx([0.75, -0.75, -0.75])


def test_informative_groups_drop_groups_whose_rewards_do_not_vary() -> None:
    trajectories = [
        _trajectory("a", "g1", [1.0]),
        _trajectory("b", "g2", [0.5]),
        _trajectory("c", "g1", [0.0]),
        _trajectory("d", "g2", [0.25, 0.25]),  # same total as b: no signal
        _trajectory("e", "g3", [1.0]),  # a group of one
        _trajectory("f", "g4", [0.0]),
        _trajectory("g", "g4", [0.0, 0.1]),
    ]
    kept, dropped = informative_groups(trajectories)
    assert [t.trajectory_id for t in kept] == ["a", "c", "f", "g"]
    assert dropped == ["g2", "g3"]
    assert informative_groups([]) == ([], [])
    # what it drops is exactly what would train on zero advantage
    advantages = group_advantages(trajectories)
    assert all(advantages[t.trajectory_id] == 0.0 for t in trajectories if t.group_id in dropped)


def test_turn_and_trajectory_validate() -> None:
    with pytest.raises(ValueError, match="one logprob per"):
        Turn((1,), (2, 3), (-1.0,), weight_version=0)
    with pytest.raises(ValueError, match="response token"):
        Turn((1,), (), (), weight_version=0)
    with pytest.raises(ValueError, match="log-probabilities"):
        Turn((1,), (2,), (0.5,), weight_version=0)
    with pytest.raises(ValueError, match="version"):
        Turn((1,), (2,), (-0.5,), weight_version=-1)
    with pytest.raises(ValueError, match="group_id"):
        Trajectory(trajectory_id="t", group_id="", env_seed=0)
    trajectory = _trajectory("t", "g", [0.25, 0.5])
    assert trajectory.total_reward == 0.75 and trajectory.response_tokens == 4
    with pytest.raises(ValueError, match="done"):
        trajectory.add_turn(_turn())


segment_lists = st.lists(st.lists(st.integers(0, 999), min_size=0, max_size=40), min_size=1, max_size=12)


@given(
    header=st.lists(st.integers(0, 999), min_size=0, max_size=20),
    segments=segment_lists,
    slack=st.integers(1, 300),
)
def test_assembled_prompt_never_exceeds_max_and_keeps_header_and_latest(
    header: list[int], segments: list[list[int]], slack: int
) -> None:
    max_tokens = len(header) + slack
    prompt = assemble_prompt(header, segments, max_tokens)
    full = [*header, *(t for s in segments for t in s)]
    assert len(prompt) <= max_tokens
    assert prompt[: len(header)] == header
    body = prompt[len(header) :]
    last = segments[-1]
    assert body[-len(last) :] == last[-len(body) :] if body and last else True
    if len(full) <= max_tokens:
        assert prompt == full
    else:
        assert full[len(full) - len(body) :] == body


def test_truncation_drops_whole_old_turns_first() -> None:
    header = [100]
    segments = [[1, 1, 1], [2], [3, 3, 3], [4], [5, 5]]
    assert assemble_prompt(header, segments, 11) == [100, 1, 1, 1, 2, 3, 3, 3, 4, 5, 5]
    assert assemble_prompt(header, segments, 10) == [100, 3, 3, 3, 4, 5, 5]
    assert assemble_prompt(header, segments, 4) == [100, 5, 5]
    assert assemble_prompt(header, segments, 2) == [100, 5]
    with pytest.raises(ValueError, match="header"):
        assemble_prompt([1, 2], segments, 2)


def test_conversation_enforces_turn_order() -> None:
    conversation = Conversation(header=(9,), max_prompt_tokens=8)
    with pytest.raises(ValueError, match="observation first"):
        conversation.add_response([1])
    conversation.add_observation([1, 2])
    with pytest.raises(ValueError, match="follow a response"):
        conversation.add_observation([3])
    assert conversation.prompt() == [9, 1, 2]
    conversation.add_response([5])
    with pytest.raises(ValueError, match="next observation"):
        conversation.prompt()
    with pytest.raises(ValueError, match="no room"):
        Conversation(header=(1, 2), max_prompt_tokens=2)


class CharCodec:
    """One token per character (code point + 10); bos 1, eos 2."""

    bos_id: int | None = 1
    eos_id: int = 2

    def encode(self, text: str) -> list[int]:
        return [ord(ch) + 10 for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - 10) for i in ids if i >= 10)


def test_episode_builds_multi_turn_prompts_from_sampled_tokens() -> None:
    codec = CharCodec()
    episode = Episode("t0", "g0", FrozenLakeEnv(seed=4), codec, max_prompt_tokens=4096)
    first = episode.prompt()
    assert first[0] == 1 and codec.decode(first).startswith(HEADER)
    responses = [[*codec.encode(" left"), 2], codec.encode("hmm"), codec.encode("up"), codec.encode("down")]
    prompts = []
    for response in responses:
        if episode.done:
            break
        prompts.append(episode.prompt())
        episode.advance(response, [-1.0] * len(response), weight_version=3)
    trajectory = episode.trajectory
    assert len(trajectory.turns) == len(prompts) >= 2
    assert trajectory.turns[1].prompt_token_ids[: len(first)] == tuple(first)
    assert trajectory.turns[1].prompt_token_ids[len(first) : len(first) + len(responses[0])] == tuple(responses[0])
    assert trajectory.total_reward == pytest.approx(sum(t.reward for t in trajectory.turns))
    assert trajectory.turns[1].reward == -0.05
    assert trajectory.done == episode.done


def test_episode_prompts_respect_the_limit_and_end_when_done() -> None:
    codec = CharCodec()
    limit = len(HEADER) + 1 + 60
    episode = Episode("t1", "g0", FrozenLakeEnv(seed=5, max_turns=4), codec, max_prompt_tokens=limit)
    while not episode.done:
        prompt = episode.prompt()
        assert len(prompt) <= limit and codec.decode(prompt).startswith(HEADER)
        episode.advance(codec.encode("nothing useful"), [-2.0] * 14, weight_version=0)
    assert len(episode.trajectory.turns) == 4
    with pytest.raises(ValueError, match="done"):
        episode.prompt()


def test_importing_rl_does_not_import_the_train_extra() -> None:
    code = (
        "import sys, rose_core.app.rl, rose_core.app.rl.demo.models;"
        "heavy = [m for m in ('torch', 'transformers', 'tokenizers', 'safetensors') if m in sys.modules];"
        "sys.exit(1 if heavy else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
