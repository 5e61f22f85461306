"""The one TOML loader and the field validators every ROSE config uses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from rose_core.config.sections import (
    ConfigSection,
    dump_toml,
    load_toml,
    parse_toml,
    require_at_least,
    require_fraction,
    require_non_negative,
    require_open_fraction,
    require_port,
    require_positive,
)
from rose_core.support.errors import ConfigError


class Engine(ConfigSection):
    slots: int = 4
    share: float = 0.5
    port: int = 0

    def __post_init__(self) -> None:
        require_positive(slots=self.slots)
        require_open_fraction(share=self.share)
        require_port(port=self.port)


class Host(ConfigSection):
    name: str = "h"
    engine: Engine = msgspec.field(default_factory=Engine)


@pytest.mark.parametrize(
    ("check", "good", "bad", "message"),
    [
        (require_positive, 0.1, 0, "`x` must be > 0 (got 0)"),
        (require_non_negative, 0, -1, "`x` must be >= 0 (got -1)"),
        (lambda **v: require_at_least(2, **v), 2, 1, "`x` must be >= 2 (got 1)"),
        (require_fraction, 1.0, 0.0, "`x` must be in (0, 1] (got 0.0)"),
        (require_open_fraction, 0.5, 1.0, "`x` must be in (0, 1) (got 1.0)"),
        (require_port, 65535, 65536, "`x` must be in 0..65535 (got 65536)"),
        (require_positive, 1, float("nan"), "`x` must be > 0 (got nan)"),
    ],
)
def test_validators_name_the_field_and_the_value(
    check: Callable[..., None], good: float, bad: float, message: str
) -> None:
    check(x=good)
    with pytest.raises(ValueError) as err:
        check(ok=good, x=bad)
    assert str(err.value) == message


def test_a_field_error_names_the_path_the_source_and_the_hint() -> None:
    with pytest.raises(ConfigError) as err:
        parse_toml(b"[engine]\nshare = 1.0\n", Host, "host.toml")
    assert str(err.value) == (
        "host.toml: field `engine`: `share` must be in (0, 1) (got 1.0); `rose config show` lists every field")
    with pytest.raises(ConfigError) as err:
        parse_toml(b"[engine]\nslots = 'x'\n", Host, "host.toml", hint="")
    assert str(err.value) == "host.toml: field `engine.slots`: Expected `int`, got `str`"


def test_unknown_fields_and_bad_toml_are_one_line() -> None:
    with pytest.raises(ConfigError, match="unknown field `engin`"):
        parse_toml(b"[engin]\n", Host)
    with pytest.raises(ConfigError, match="config is not valid TOML"):
        parse_toml(b"name = [", Host)


def test_load_toml_reads_a_file_and_names_an_unreadable_one(tmp_path: Path) -> None:
    path = tmp_path / "host.toml"
    path.write_text(dump_toml(Host(name="x")))
    assert load_toml(path, Host) == Host(name="x")
    with pytest.raises(ConfigError) as err:
        load_toml(tmp_path / "nope.toml", Host, what="the host config", fix="fix --config")
    assert str(err.value).startswith("cannot read the host config ") and str(err.value).endswith("; fix --config")
    assert "\n" not in str(err.value)
