"""The `rose` CLI's own failure paths and reports (no engines needed)."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from rose_core.app.cli import main
from rose_core.app.config import RunConfig
from rose_core.protocol.auth import executor_credential


def rose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rose_core", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_config_show_prints_every_default_as_toml() -> None:
    out = rose("config", "show")
    assert out.returncode == 0
    assert msgspec.toml.decode(out.stdout, type=RunConfig) == RunConfig()


def test_config_show_json() -> None:
    out = rose("config", "show", "--json")
    assert msgspec.json.decode(out.stdout, type=RunConfig) == RunConfig()


def test_bad_config_is_one_line_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[rl]\nsteps = 'many'\n")
    out = rose("run", "--config", str(bad))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "field `rl.steps`" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("missing", "install"),
    [("torch", "rose-core[train]"), ("rose_transfer", "rose-transfer"), ("rose_executor", "rose-executor[cpu]"),
     ("vllm", "rose-executor[cpu]")],
)
def test_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch, missing: str, install: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == missing else (real(name) or object())

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    result = CliRunner().invoke(main, ["run", "--steps", "1"])
    assert result.exit_code == 2
    assert f"pip install {install}" in result.output and "Traceback" not in result.output


def test_resume_from_a_directory_without_checkpoints_names_the_fix(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "--steps", "2", "--resume", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert str(tmp_path) in result.output and "Traceback" not in result.output


def test_a_stop_request_outside_the_steps_never_kills_the_command(tmp_path: Path) -> None:
    """SIGUSR1 asks `rose run` to stop after the step in flight; outside the steps (start-up, the report being
    written) it is ignored, not left at its default, which terminates the process with no report."""
    before = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        result = CliRunner().invoke(main, ["run", "--steps", "2", "--resume", str(tmp_path)])  # ends before a step
        assert result.exit_code == 2, result.output
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_resume_from_a_checkpoint_past_the_last_step_asks_for_more_steps(tmp_path: Path) -> None:
    from rose_core.app.rl.trainer.checkpoint_dir import OPTIMIZER_FILE, POLICY_FILE, CheckpointState, write_checkpoint

    def fill(folder: Path) -> None:
        (folder / POLICY_FILE).write_bytes(b"p")
        (folder / OPTIMIZER_FILE).write_bytes(b"o")

    write_checkpoint(tmp_path, CheckpointState(step=3, weight_version=3), fill, keep=1)
    result = CliRunner().invoke(main, ["run", "--steps", "3", "--resume", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "after step 3" in result.output and "--steps above 3" in result.output


def test_plot_without_matplotlib_names_the_extra_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(main, ["run", "--steps", "1", "--plot", "run.png"])
    assert result.exit_code == 2, result.output
    assert "rose-core[sim]" in result.output and "Traceback" not in result.output


def test_executor_key_writes_a_key_that_only_that_executor_can_use(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32)
    out = rose("executor-key", "gpu-7", "--secret-file", str(secret), "--out", str(tmp_path / "k"))
    assert out.returncode == 0 and "executor gpu-7's key" in out.stdout
    assert (tmp_path / "k").stat().st_mode & 0o777 == 0o600
    assert executor_credential((tmp_path / "k").read_bytes(), "gpu-7") == executor_credential(b"s" * 32, "gpu-7")
    refused = rose("executor-key", "two words", "--secret-file", str(secret), "--out", str(tmp_path / "bad"))
    assert refused.returncode == 2 and "bad executor id" in refused.stderr and "Traceback" not in refused.stderr
    missing = rose("executor-key", "gpu-7", "--secret-file", str(tmp_path / "nope"), "--out", str(tmp_path / "k2"))
    assert missing.returncode == 2 and "cannot read the secret file" in missing.stderr
