"""Credentials: the shared secret and the keys derived from it (the observer key a dashboard gets, the executor
key file an executor's host gets, the weights key)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from rose_core.protocol.auth import (
    EXECUTOR_KEY_PREFIX,
    OBSERVER_KEY_PREFIX,
    as_observer,
    as_weights_key,
    executor_credential,
    executor_key,
    load_secret,
    observer_key,
    weights_key,
    write_executor_key,
    write_observer_key,
)
from rose_core.support.errors import ConfigError

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


# ---------------------------------------------------------------- executor keys


def test_an_executor_key_file_holds_what_the_secret_derives_for_that_executor_and_not_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "executor-serving-0.key"
    write_executor_key(path, SECRET, "serving-0")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    held = load_secret(path)
    assert held.startswith(EXECUTOR_KEY_PREFIX) and SECRET not in held
    from_file, from_secret = executor_credential(held, "serving-0"), executor_credential(SECRET, "serving-0")
    assert from_file == from_secret
    assert from_file.control == executor_key(SECRET, "serving-0") != executor_key(SECRET, "serving-1")
    assert from_file.weights == weights_key(SECRET) == as_weights_key(held) == as_weights_key(SECRET)
    assert from_file.observer == observer_key(SECRET)
    assert len({from_file.control, from_file.weights, from_file.observer, SECRET}) == 4


def test_another_executors_key_names_the_id_to_start_with() -> None:
    held = b"rose-executor-key:serving-0 " + b" ".join([b"a" * 64] * 3)
    with pytest.raises(ConfigError, match=r"executor 'serving-0'.*--executor-id serving-0.*executor-serving-1\.key"):
        executor_credential(held, "serving-1")


@pytest.mark.parametrize(("held", "match"), [
    (OBSERVER_KEY_PREFIX + b"ab" * 32, "observer key"),
    (EXECUTOR_KEY_PREFIX + b"serving-0 only-two-fields", "malformed executor key file"),
])
def test_keys_that_cannot_run_an_executor_are_refused_with_the_fix(held: bytes, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        executor_credential(held, "serving-0")


def test_an_observer_key_cannot_reach_the_weights() -> None:
    with pytest.raises(ConfigError, match="observer key cannot fetch"):
        as_weights_key(OBSERVER_KEY_PREFIX + observer_key(SECRET))


@pytest.mark.parametrize("bad_id", ["", "two words", "x" * 129])
def test_an_executor_id_that_cannot_be_written_is_refused(tmp_path: Path, bad_id: str) -> None:
    with pytest.raises(ConfigError, match="bad executor id"):
        write_executor_key(tmp_path / "k", SECRET, bad_id)
    assert not (tmp_path / "k").exists()
