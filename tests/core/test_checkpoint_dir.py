"""The checkpoint directory: atomic step folders, keep-last-K, crash leftovers, damaged and foreign folders."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from rose_core.app.rl.trainer.checkpoint_dir import (
    STATE_FILE,
    CheckpointError,
    CheckpointState,
    checkpoints,
    folder_name,
    latest,
    read_state,
    resolve,
    write_checkpoint,
)
from rose_core.app.rl.trainer.host_rng import capture_host_rng, restore_host_rng


def _fill(payload: bytes = b"weights" * 100):
    def fill(folder: Path) -> None:
        (folder / "policy.safetensors").write_bytes(payload)
        (folder / "optimizer.safetensors").write_bytes(payload[::-1] + b"!")

    return fill


def _save(root: Path, step: int, *, keep: int = 3, payload: bytes = b"weights" * 100) -> Path:
    state = CheckpointState(step=step, weight_version=step + 10, trainer_steps=2 * step, extra={"note": "hi"})
    return write_checkpoint(root, state, _fill(payload), keep=keep)


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_folder_names_are_zero_padded_so_they_sort_like_steps() -> None:
    assert folder_name(12) == "step-000012"
    assert folder_name(1_234_567) == "step-1234567"
    with pytest.raises(ValueError, match=">= 0"):
        folder_name(-1)


def test_a_written_checkpoint_reads_back_with_its_files_digests(tmp_path: Path) -> None:
    folder = _save(tmp_path / "ckpt", 12)
    assert folder == tmp_path / "ckpt" / "step-000012"
    assert _names(folder) == ["optimizer.safetensors", "policy.safetensors", STATE_FILE]
    state = read_state(folder)
    assert (state.step, state.weight_version, state.trainer_steps, state.extra) == (12, 22, 24, {"note": "hi"})
    assert state.files["policy.safetensors"].size == 700 and len(state.files["policy.safetensors"].sha256) == 64
    assert _names(tmp_path / "ckpt") == ["step-000012"]


def test_only_the_newest_keep_checkpoints_remain(tmp_path: Path) -> None:
    for step in range(1, 6):
        _save(tmp_path, step, keep=2)
    assert _names(tmp_path) == ["step-000004", "step-000005"]
    assert latest(tmp_path) == tmp_path / "step-000005"


def test_a_failed_write_leaves_the_older_checkpoints_and_no_partial_folder(tmp_path: Path) -> None:
    _save(tmp_path, 1, keep=1)

    def crash(folder: Path) -> None:
        (folder / "policy.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(tmp_path, CheckpointState(step=2, weight_version=2), crash, keep=1)
    assert _names(tmp_path) == ["step-000001"]


def test_latest_ignores_and_removes_what_a_crashed_writer_left(tmp_path: Path) -> None:
    _save(tmp_path, 1)
    partial = tmp_path / ".partial-step-000002-4242"
    partial.mkdir()
    (partial / "policy.safetensors").write_bytes(b"trunc")
    (tmp_path / ".trash-step-000000-4242").mkdir()
    assert latest(tmp_path) == tmp_path / "step-000001"
    assert _names(tmp_path) == ["step-000001"]


def test_a_truncated_file_in_a_step_folder_is_named_with_the_fix(tmp_path: Path) -> None:
    folder = _save(tmp_path, 3)
    (folder / "policy.safetensors").write_bytes(b"weights")
    with pytest.raises(CheckpointError, match=r"step-000003 is damaged \(policy.safetensors is 7 bytes.*delete"):
        latest(tmp_path)


def test_a_flipped_byte_fails_the_sha256_check(tmp_path: Path) -> None:
    folder = _save(tmp_path, 3)
    (folder / "optimizer.safetensors").write_bytes(b"X" * 701)
    read_state(folder, verify=False)
    with pytest.raises(CheckpointError, match="does not match its sha256"):
        read_state(folder)


def test_a_corrupt_state_json_names_the_path_and_the_fix(tmp_path: Path) -> None:
    folder = _save(tmp_path, 3)
    (folder / STATE_FILE).write_text('{"step": 3, "weight_ver')
    with pytest.raises(CheckpointError, match=rf"{folder}.*not valid JSON.*delete that folder"):
        latest(tmp_path)
    (folder / STATE_FILE).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"damaged \(state.json holds a list, not an object"):
        read_state(folder)
    (folder / STATE_FILE).write_text(json.dumps({"format_version": 1, "step": "three", "weight_version": 1}))
    with pytest.raises(CheckpointError, match=r"damaged \(Expected `int`, got `str` - at `\$.step`"):
        read_state(folder)


def test_an_unknown_format_version_is_refused(tmp_path: Path) -> None:
    folder = _save(tmp_path, 3)
    state = json.loads((folder / STATE_FILE).read_text())
    (folder / STATE_FILE).write_text(json.dumps({**state, "format_version": 99}))
    with pytest.raises(CheckpointError, match="format version 99; this ROSE reads version 1"):
        latest(tmp_path)


def test_resume_directories_that_hold_no_checkpoint_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        latest(tmp_path / "nowhere")
    (tmp_path / "notes").mkdir()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        latest(tmp_path)
    with pytest.raises(CheckpointError, match=r"is missing, so .* is not a checkpoint"):
        read_state(tmp_path / "notes")


def test_resolve_takes_a_step_folder_or_the_directory_holding_them(tmp_path: Path) -> None:
    first = _save(tmp_path, 1)
    second = _save(tmp_path, 2)
    assert resolve(first) == first
    assert resolve(tmp_path) == second


def test_saving_a_step_that_exists_or_is_older_than_the_newest_is_refused(tmp_path: Path) -> None:
    _save(tmp_path, 5)
    with pytest.raises(CheckpointError, match="exists already"):
        _save(tmp_path, 5)
    with pytest.raises(CheckpointError, match="holds step-000005, newer than step 4"):
        _save(tmp_path, 4)
    assert checkpoints(tmp_path) == [tmp_path / "step-000005"]


def test_state_that_is_not_json_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    state = CheckpointState(step=1, weight_version=1, extra={"when": object()})
    with pytest.raises(CheckpointError, match="cannot be saved as JSON"):
        write_checkpoint(tmp_path / "ckpt", state, _fill(), keep=1)
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(ValueError, match="keep >= 1"):
        write_checkpoint(tmp_path, CheckpointState(step=1, weight_version=1), _fill(), keep=0)


def test_host_generators_come_back_through_json() -> None:
    random.seed(7)
    np.random.seed(7)
    saved = json.loads(json.dumps(capture_host_rng()))
    expected = (random.random(), np.random.rand(3).tolist(), np.random.randn())
    random.seed(99)
    np.random.seed(99)
    restore_host_rng(saved)
    assert (random.random(), np.random.rand(3).tolist(), np.random.randn()) == expected
    with pytest.raises(ValueError, match="malformed host RNG state"):
        restore_host_rng({"python": [3]})
