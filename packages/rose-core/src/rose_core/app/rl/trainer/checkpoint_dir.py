"""A directory of training checkpoints: ``step-000012/`` folders, each either complete or absent.

Invariant: a folder named ``step-NNNNNN`` exists only once its files and their ``state.json`` are written
and fsynced. It is filled as ``.partial-step-NNNNNN-<pid>`` beside it and renamed in one step (then the
directory is fsynced), so a crash leaves at most a partial folder, which ``latest`` ignores and deletes.
Older checkpoints are pruned to the newest ``keep`` only after the new one is in place, each renamed to
``.trash-...`` before it is deleted, so a crash while pruning never leaves a half-deleted ``step-`` folder.
One writer per directory. No torch here: what goes into the folder is the ``fill`` callback's business.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from rose_core.support.durable import fsync_dir
from rose_core.support.errors import RoseError

FORMAT_VERSION = 1
STATE_FILE = "state.json"
POLICY_FILE = "policy.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
_STEP = re.compile(r"step-(\d{6,})")
_LEFTOVER_PREFIXES = (".partial-", ".trash-")
_CHUNK = 1 << 20


class CheckpointError(RoseError):
    """A checkpoint cannot be written or resumed from; the message names the path and the fix."""


@dataclass(frozen=True, slots=True)
class FileDigest:
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What ``state.json`` holds. ``step`` is the RL step the checkpoint ends; ``trainer_steps`` the trainer's
    own update counter; ``rl`` the run config's ``[rl]`` section; ``extra`` whatever the caller adds (JSON);
    ``rng`` the host generators (``rose_core.app.rl.trainer.host_rng``); ``files`` every other file in the folder."""

    step: int
    weight_version: int
    trainer_steps: int = 0
    rl: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    files: dict[str, FileDigest] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION


def folder_name(step: int) -> str:
    """``step-000012``: zero-padded so names sort like steps."""
    if step < 0:
        raise ValueError(f"checkpoint step {step} must be >= 0")
    return f"step-{step:06d}"


def write_checkpoint(root: Path, state: CheckpointState, fill: Callable[[Path], None], *, keep: int) -> Path:
    """Create ``root/step-NNNNNN`` atomically: ``fill(folder)`` writes the files, this adds ``state.json``
    (with every file's size and sha256), fsyncs, renames, then keeps only the newest ``keep`` checkpoints."""
    if keep < 1:
        raise ValueError(f"keep={keep}: keep at least the checkpoint being written (keep >= 1)")
    _require_json(state)
    root.mkdir(parents=True, exist_ok=True)
    remove_leftovers(root)
    final = root / folder_name(state.step)
    _check_room(root, final, state.step)
    partial = root / f".partial-{final.name}-{os.getpid()}"
    partial.mkdir()
    try:
        fill(partial)
        digests = {p.name: _digest_and_sync(p) for p in sorted(partial.iterdir()) if p.name != STATE_FILE}
        _write_json_synced(partial / STATE_FILE, replace(state, files=digests))
        fsync_dir(partial)
        os.rename(partial, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    prune(root, keep)
    return final


def latest(root: Path) -> Path:
    """The newest complete checkpoint under ``root`` (partial folders are deleted, never returned)."""
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint directory {root} does not exist: pass the directory an earlier run saved into"
        )
    remove_leftovers(root)
    folders = checkpoints(root)
    if not folders:
        raise CheckpointError(
            f"{root} holds no checkpoint (no step-NNNNNN folder): pass the directory an earlier run saved "
            "into, or start without --resume"
        )
    read_state(folders[-1], verify=False)
    return folders[-1]


def resolve(path: Path) -> Path:
    """``path`` itself when it is one checkpoint folder, else ``latest(path)``."""
    return path if (path / STATE_FILE).is_file() else latest(path)


def checkpoints(root: Path) -> list[Path]:
    """The ``step-NNNNNN`` folders under ``root``, oldest first."""
    found = [p for p in root.iterdir() if _STEP.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns the deleted folders."""
    doomed = checkpoints(root)[:-keep]
    for folder in doomed:
        trash = root / f".trash-{folder.name}-{os.getpid()}"
        os.rename(folder, trash)
        shutil.rmtree(trash)
    if doomed:
        fsync_dir(root)
    return doomed


def remove_leftovers(root: Path) -> list[Path]:
    """Delete what a crashed writer left (``.partial-*`` and ``.trash-*`` folders); returns them."""
    leftovers = [p for p in root.iterdir() if p.name.startswith(_LEFTOVER_PREFIXES)]
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return leftovers


def read_state(folder: Path, *, verify: bool = True) -> CheckpointState:
    """``folder``'s ``state.json``, after checking its files' sizes (and, with ``verify``, their sha256)."""
    raw = _read_json(folder / STATE_FILE)
    if not isinstance(raw, dict):
        raise _corrupt(folder, f"{STATE_FILE} holds a {type(raw).__name__}, not an object")
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{folder / STATE_FILE} has checkpoint format version {version!r}; this ROSE reads version "
            f"{FORMAT_VERSION}: resume with the ROSE release that wrote it"
        )
    try:
        state = msgspec.convert(raw, CheckpointState)
    except msgspec.ValidationError as exc:
        raise _corrupt(folder, str(exc)) from exc
    for name, digest in state.files.items():
        _check_file(folder / name, digest, verify=verify)
    return state


def _require_json(state: CheckpointState) -> None:
    try:
        json.dumps(asdict(state), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"the checkpoint's state cannot be saved as JSON ({exc}): pass only plain numbers, strings, "
            "lists and dicts in `extra` and `rl`"
        ) from exc


def _check_room(root: Path, final: Path, step: int) -> None:
    if final.exists():
        raise CheckpointError(f"{final} exists already: resume from it, or delete it to save step {step} again")
    newer = [p.name for p in checkpoints(root) if int(p.name.removeprefix("step-")) > step]
    if newer:
        raise CheckpointError(
            f"{root} holds {newer[-1]}, newer than step {step}, which pruning would keep instead: "
            "resume from the newest checkpoint, or move the newer ones away"
        )


def _check_file(path: Path, digest: FileDigest, *, verify: bool) -> None:
    size = path.stat().st_size if path.is_file() else None
    if size != digest.size:
        found = "missing" if size is None else f"{size} bytes"
        raise _corrupt(path.parent, f"{path.name} is {found}, state.json says {digest.size} bytes")
    if verify and _sha256(path) != digest.sha256:
        raise _corrupt(path.parent, f"{path.name} does not match its sha256 in state.json")


def _corrupt(folder: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {folder} is damaged ({why}): delete that folder to resume from the previous checkpoint"
    )


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(
            f"{path} is missing, so {path.parent} is not a checkpoint: pass a step-NNNNNN folder or the "
            "directory holding them"
        )
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _corrupt(path.parent, f"{path.name} is not valid JSON: {exc}") from exc


def _write_json_synced(path: Path, state: CheckpointState) -> None:
    with path.open("w", encoding="utf-8") as out:
        json.dump(asdict(state), out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())


def _digest_and_sync(path: Path) -> FileDigest:
    if not path.is_file():
        raise CheckpointError(f"{path} is not a plain file: a checkpoint holds only files")
    with path.open("rb") as data:
        os.fsync(data.fileno())
    return FileDigest(size=path.stat().st_size, sha256=_sha256(path))


def _sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as data:
        while chunk := data.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()
