"""The environment registry (built-ins, then the ``rose.environments`` entry points of installed packages) and
an Episode played end to end on a plugin's environment (the corridor of ``corridor_env.py``)."""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points, version
from pathlib import Path

import pytest

from rose_core.app.config import RLConfig
from rose_core.app.rl.environments.episode import Episode
from rose_core.app.rl.environments.frozenlake import HEADER, FrozenLakeEnv, make_frozenlake
from rose_core.app.rl.environments.registry import ENTRY_POINT_GROUP, installed_environments, load_environment
from rose_core.support.errors import RoseError

ROOT = Path(__file__).parents[2]
PYPROJECT = ROOT / "packages" / "rose-core" / "pyproject.toml"


class CharCodec:
    """One token per character (code point + 10); bos 1, eos 2."""

    bos_id: int | None = 1
    eos_id: int = 2

    def encode(self, text: str) -> list[int]:
        return [ord(ch) + 10 for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - 10) for i in ids if i >= 10)


def test_frozenlake_is_built_in_and_makes_the_rl_sections_map() -> None:
    factory = load_environment("frozenlake")
    assert factory is make_frozenlake and "frozenlake" in installed_environments()
    env = factory(3, RLConfig(env_size=5, max_turns=6))
    assert isinstance(env, FrozenLakeEnv) and env.reset().startswith(HEADER) and env.header == HEADER
    assert (env.seed, len(env.lake.rows), env.max_turns) == (3, 5, 6)


def test_rose_core_registers_frozenlake_as_an_entry_point_of_its_own() -> None:
    registered = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    assert EntryPoint("frozenlake", registered["frozenlake"], ENTRY_POINT_GROUP).load() is make_frozenlake


def test_an_installed_plugin_is_found_through_its_entry_point(lake_plugin: Path) -> None:
    assert version("lake_plugin") == "0.1"
    assert "corridor" in {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    factory = load_environment("corridor")
    assert factory is sys.modules["lake_plugin"].make_corridor
    assert sys.modules["lake_plugin"].__file__ == str(lake_plugin / "lake_plugin.py")
    assert {"corridor", "frozenlake", "broken", "not_callable"} <= set(installed_environments())


def test_a_plugin_cannot_shadow_a_built_in(lake_plugin: Path) -> None:
    assert "frozenlake" in {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert load_environment("frozenlake") is make_frozenlake


def test_an_unknown_name_lists_the_installed_ones_and_how_to_install_one(lake_plugin: Path) -> None:
    with pytest.raises(RoseError) as err:
        load_environment("foo")
    text = str(err.value)
    assert text.startswith("no environment 'foo' in the entry-point group rose.environments (installed: ")
    assert "broken, corridor, frozenlake, not_callable)" in text and "pip install the package" in text


def test_without_plugins_the_error_lists_the_built_ins() -> None:
    with pytest.raises(RoseError, match=r"\(installed: frozenlake\): pip install the package that provides it"):
        load_environment("corridor")


def test_an_entry_point_that_is_not_callable_is_refused(lake_plugin: Path) -> None:
    with pytest.raises(RoseError, match=r"'not_callable' \(lake_plugin:NOT_A_FACTORY, .*is a str, not callable"):
        load_environment("not_callable")


def test_a_plugin_that_fails_to_import_is_named_in_the_error(lake_plugin: Path) -> None:
    with pytest.raises(RoseError) as err:
        load_environment("broken")
    text = str(err.value)
    assert "environment 'broken' (lake_plugin_broken:make_broken, entry-point group rose.environments)" in text
    assert "ModuleNotFoundError" in text and "a_module_that_is_not_installed" in text
    assert "reinstall the package that provides it" in text and isinstance(err.value.__cause__, ImportError)


def _play(episode: Episode, codec: CharCodec, answer: str) -> None:
    while not episode.done:
        prompt = episode.prompt()
        assert codec.decode(prompt).startswith("Corridor: walk to the exit")
        response = [*codec.encode(answer), codec.eos_id]
        episode.advance(response, [-0.5] * len(response), weight_version=1)


def test_an_episode_walks_the_plugins_corridor_to_its_exit(lake_plugin: Path) -> None:
    codec = CharCodec()
    rl = RLConfig(env="corridor", env_size=4, max_turns=5)
    env = load_environment(rl.env)(0, rl)
    episode = Episode("t0", "g0", env, codec, max_prompt_tokens=4096)
    _play(episode, codec, "right")
    trajectory = episode.trajectory
    assert trajectory.done and trajectory.success and trajectory.env_seed == 0
    assert [t.reward for t in trajectory.turns] == [0.0, 0.0, 1.0]
    assert codec.decode(trajectory.turns[-1].prompt_token_ids).endswith("cell 2 of 4. move:")


def test_an_episode_that_never_reaches_the_exit_fails_after_max_turns(lake_plugin: Path) -> None:
    codec = CharCodec()
    rl = RLConfig(env="corridor", env_size=4, max_turns=3)
    episode = Episode("t1", "g1", load_environment(rl.env)(5, rl), codec)
    _play(episode, codec, "wait")
    trajectory = episode.trajectory
    assert trajectory.done and not trajectory.success and len(trajectory.turns) == 3
    assert trajectory.total_reward == pytest.approx(-0.3) and trajectory.env_seed == 5


def test_the_docs_show_the_corridor_the_tests_play() -> None:
    section = (ROOT / "docs" / "rl.md").read_text().split("## Environments", 1)[1]
    shown = section.split("```python\n", 1)[1].split("```", 1)[0]
    tested = Path(__file__).with_name("corridor_env.py").read_text().split("from __future__ import annotations\n")[1]
    code = [line for line in tested.splitlines() if line and not line.startswith("NOT_A_FACTORY")]
    assert [line for line in shown.splitlines() if line] == code
