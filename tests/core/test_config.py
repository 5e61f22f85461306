from __future__ import annotations

from pathlib import Path

import pytest

from rose_core.config import RunConfig, load_config
from rose_core.config_support import dump_toml, parse_toml
from rose_core.errors import ConfigError


def test_defaults_round_trip_through_toml(tmp_path: Path) -> None:
    path = tmp_path / "rose.toml"
    path.write_text(dump_toml(RunConfig()))
    assert load_config(path) == RunConfig()


def test_partial_config_overrides_only_what_it_names() -> None:
    cfg = parse_toml(b"[rl]\nsteps = 7\n", RunConfig)
    assert cfg.rl.steps == 7 and cfg.rl.group_size == RunConfig().rl.group_size


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        (b"[rl]\nsteps = 'three'\n", "field `rl.steps`: Expected `int`, got `str`"),
        (b"[rl]\nsteps = 0\n", "`steps` must be > 0"),
        (b"[rl]\ngroup_size = 1\n", "`group_size` must be >= 2"),
        (b"[schedular]\nx = 1\n", "unknown field `schedular`"),
        (b"[controller]\nport = 70000\n", "`port` must be in 0..65535"),
        (b"[slo]\nheadroom_fraction = 2.0\n", "headroom_fraction"),
        (b"[executors]\ndedicated = 0\nserving = 0\n", "need at least one executor"),
        (b"steps = [", "not valid TOML"),
    ],
)
def test_bad_configs_name_the_field_and_the_fix(toml: bytes, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_toml(toml, RunConfig, "my.toml")
    text = str(err.value)
    assert needle in text and "my.toml" in text
    assert "\n" not in text


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.toml")
