"""The file a weight version is received into: a hidden temp file, written with ``pwrite`` (on the
project's VMs, faulting fresh pages of a shared file mapping costs 5x more than writing them), renamed
to its final name only once every byte is verified (a version is applied whole or not at all)."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from rose_core.support.durable import fsync_dir
from rose_transfer.errors import TransferError

log = logging.getLogger(__name__)


class PartialFile:
    def __init__(self, dest: Path, size: int) -> None:
        self.dest = dest
        self.size = size
        self.temp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part")
        self._fd = -1
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            if size:
                _reserve(self._fd, size)
        except OSError as exc:
            self.discard()
            raise TransferError(
                f"cannot hold {size} bytes of weights at {dest.parent} ({exc.strerror}): "
                "free space there, fix its permissions, or choose another weights directory"
            ) from exc

    def write(self, offset: int, data: Any) -> None:
        """Write ``data`` at ``offset`` (callable from worker threads; the GIL is released meanwhile)."""
        view = memoryview(data).cast("B")
        if offset < 0 or offset + view.nbytes > self.size:
            raise ValueError(f"write of {view.nbytes} bytes at {offset} is outside a file of {self.size}")
        while view.nbytes:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written

    def commit(self, durable: bool = True) -> Path:
        """Move the complete file to its final name (atomically, replacing an older file)."""
        if durable:
            os.fsync(self._fd)
        self._close()
        os.replace(self.temp, self.dest)
        if durable:
            fsync_dir(self.dest.parent)
        return self.dest

    def discard(self) -> None:
        self._close()
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            self.temp.unlink()

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _reserve(fd: int, size: int) -> None:
    """Allocate the file's blocks now: a full disk fails here (ENOSPC), not as SIGBUS while writing the map."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)
    else:  # macOS: no fallocate; the map is still safe to write, space is just not reserved up front
        os.ftruncate(fd, size)
