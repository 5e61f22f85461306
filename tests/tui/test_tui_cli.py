"""The ``rose-tui`` command line: errors a user can meet are one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources

import pytest
from click.testing import CliRunner

from rose_tui.cli import main


@pytest.fixture
def no_secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROSE_SECRET", raising=False)
    monkeypatch.delenv("ROSE_SECRET_FILE", raising=False)


def test_missing_secret_is_one_line(no_secret_env: None) -> None:
    result = CliRunner().invoke(main, ["--connect", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert "no shared secret" in lines[0] and "ROSE_SECRET_FILE" in lines[0]


def test_unreadable_secret_file_is_one_line(no_secret_env: None) -> None:
    result = CliRunner().invoke(main, ["--connect", "tcp://127.0.0.1:1", "--secret-file", "/nonexistent/secret"])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "cannot read the secret file" in result.output


def test_bad_address_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROSE_SECRET", "x" * 32)
    monkeypatch.delenv("ROSE_SECRET_FILE", raising=False)
    result = CliRunner().invoke(main, ["--connect", "localhost:5555"])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "tcp://HOST:PORT" in result.output


def test_connect_is_required() -> None:
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 2
    assert "--connect" in result.output


def test_python_dash_m() -> None:
    out = subprocess.run([sys.executable, "-m", "rose_tui", "--help"], capture_output=True, text=True, check=True)
    assert "--connect" in out.stdout and "--secret-file" in out.stdout


def test_stylesheet_ships_as_package_data() -> None:
    assert resources.files("rose_tui").joinpath("rose_tui.tcss").is_file()


def test_errors_name_the_program_like_every_rose_cli(no_secret_env: None) -> None:
    result = CliRunner().invoke(main, ["--connect", "tcp://127.0.0.1:1"])
    assert result.output.startswith("rose-tui: error: no shared secret")
