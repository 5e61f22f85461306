"""The versions a ``WeightFetcher`` committed and can patch against: the receiver's base.

The fetcher records each file it committed (path, manifest, which buckets hold valid bytes). When it
is asked for a new version while holding ``have_version`` in a file that still exists with the same
bucket layout, that file is mapped read-only and the fetch asks for patches against it; otherwise
the fetch is a full (dense) sync. The newest ``keep`` records are kept."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rose_core.protocol.messages import WeightManifest


@dataclass(slots=True, frozen=True)
class HeldBase:
    path: Path
    manifest: WeightManifest
    buckets: frozenset[int]


class HeldBases:
    def __init__(self, keep: int = 2) -> None:
        self._keep = keep
        self._held: dict[int, HeldBase] = {}

    def record(self, path: Path, manifest: WeightManifest, buckets: frozenset[int]) -> None:
        self._held[manifest.version] = HeldBase(path, manifest, buckets)
        for old in sorted(self._held)[: -self._keep]:
            del self._held[old]

    def forget(self, version: int) -> None:
        self._held.pop(version, None)

    def usable(self, have_version: int, manifest: WeightManifest) -> tuple[BaseFile, frozenset[int]] | None:
        """The held file of ``have_version`` (opened for reading) and its valid buckets, if it fits ``manifest``."""
        held = self._held.get(have_version)
        if held is None or not _same_layout(held.manifest, manifest):
            return None
        try:
            base = BaseFile(held.path)
        except OSError:
            return None
        if base.size != manifest.total_bytes:
            base.close()
            return None
        return base, held.buckets


class BaseFile:
    """The held version's file, read with ``pread`` from worker threads (an open descriptor keeps the
    bytes readable even if the file is unlinked meanwhile)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def read_into(self, offset: int, out: np.ndarray) -> None:
        view = out.reshape(-1).view(np.uint8).data
        while view.nbytes:
            n = os.preadv(self.fd, [view], offset)
            if n <= 0:
                raise OSError(f"the held weight file ended at byte {offset}")
            view, offset = view[n:], offset + n

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _same_layout(old: WeightManifest, new: WeightManifest) -> bool:
    return (
        old.total_bytes == new.total_bytes
        and old.bucket_bytes == new.bucket_bytes
        and [(b.offset, b.nbytes) for b in old.buckets] == [(b.offset, b.nbytes) for b in new.buckets]
    )
