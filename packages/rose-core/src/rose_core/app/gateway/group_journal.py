"""Complete gateway groups on disk until a checkpoint covers the step that trained them, so a controller restarted
with ``--resume`` trains them again instead of losing them.

A group is written when its last session's reward closes it (one file per group, ``<serial>.msgpack``, written
whole or not at all: a temporary file renamed into place), and deleted once a checkpoint was written after the
step that trained it. A job that starts takes whatever an earlier process left (``recover``): a resumed job puts
those groups back as complete (the steps it runs again train them), a job that is not resumed discards them.

Invariant: every complete group not yet covered by a checkpoint has its file; no file outlives its checkpoint.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import msgspec

from rose_core.app.rl.algorithm.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass(slots=True)
class JournaledGroup:
    serial: int
    name: str
    trajectories: list[Trajectory]


class _Entry(msgspec.Struct):
    serial: int
    name: str
    trajectories: list[Trajectory]


class GroupJournal:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(_Entry)

    def save(self, group: JournaledGroup) -> None:
        path = self._path(group.serial)
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(self._encoder.encode(_Entry(group.serial, group.name, group.trajectories)))
        os.replace(temporary, path)

    def drop(self, serials: list[int]) -> None:
        for serial in serials:
            self._path(serial).unlink(missing_ok=True)

    def recover(self) -> list[JournaledGroup]:
        """Every group an earlier process left, oldest first, taken out of the directory (an unreadable file is
        logged and skipped)."""
        groups = []
        for path in sorted(self.directory.glob("*.msgpack")):
            try:
                entry = self._decoder.decode(path.read_bytes())
            except (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                log.warning("gateway: skipping the unreadable journaled group %s (%s)", path, exc)
            else:
                groups.append(JournaledGroup(entry.serial, entry.name, entry.trajectories))
            path.unlink(missing_ok=True)
        for leftover in self.directory.glob("*.tmp"):
            leftover.unlink(missing_ok=True)
        return groups

    def _path(self, serial: int) -> Path:
        return self.directory / f"{serial:012d}.msgpack"
