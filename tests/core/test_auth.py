"""Credentials: the shared secret and the observer key derived from it (what a dashboard gets)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from rose_core.auth import OBSERVER_KEY_PREFIX, as_observer, load_secret, observer_key, write_observer_key
from rose_core.errors import ConfigError

SECRET = b"s" * 32


def test_an_observer_key_file_and_the_secret_give_the_same_observer_key(tmp_path: Path) -> None:
    path = tmp_path / "run" / "observer.key"
    write_observer_key(path, SECRET)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # like the secret: the owner's only
    held = load_secret(path)
    assert held.startswith(OBSERVER_KEY_PREFIX) and SECRET not in held
    assert as_observer(held) == as_observer(SECRET) == observer_key(SECRET)
    assert observer_key(SECRET) != observer_key(b"t" * 32) and len(observer_key(SECRET)) == 64


def test_a_missing_observer_key_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"observer\.key"):
        load_secret(tmp_path / "observer.key")
