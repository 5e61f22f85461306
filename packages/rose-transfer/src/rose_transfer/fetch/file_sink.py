"""``FileSink``: a pull into a version file (``PartialFile``), patches applied to the held base file."""

from __future__ import annotations

import contextlib
from collections import deque
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from rose_core.protocol.messages import BucketInfo, WeightManifest
from rose_transfer.fetch.bucket_buffers import BucketBuffers
from rose_transfer.fetch.bucket_checker import BucketChecker
from rose_transfer.fetch.fetch_progress import FetchProgress
from rose_transfer.fetch.held_bases import HeldBases
from rose_transfer.fetch.partial_file import PartialFile
from rose_transfer.wire.frame_connection import REPLY_OVERHEAD


class FileSink:
    def __init__(
        self,
        secret: bytes,
        progress: FetchProgress,
        dest: Path,
        bases: HeldBases,
        buffers: BucketBuffers,
        window: int,
    ) -> None:
        self._secret = secret
        self._progress = progress
        self._dest = dest
        self._bases = bases
        self._buffers = buffers
        self.window = window
        self._stack = contextlib.ExitStack()
        self._free: deque[np.ndarray] = deque()
        self._checker: BucketChecker | None = None

    @property
    def pool(self) -> Executor:
        return self._check().pool

    def prepare(self, manifest: WeightManifest) -> None:
        progress = self._progress
        progress.file = PartialFile(self._dest, manifest.total_bytes)
        held = self._bases.usable(progress.have_version, manifest)
        if held is not None:
            progress.base, progress.base_buckets = held
        self._checker = BucketChecker(self._secret, manifest.bucket_bytes + REPLY_OVERHEAD)
        largest = max((b.nbytes for b in manifest.buckets), default=0)
        self._free = deque(self._stack.enter_context(self._buffers.lend(self.window, largest)))

    def landing(self, info: BucketInfo) -> tuple[np.ndarray, memoryview]:
        buffer = self._free.popleft()
        return buffer, buffer.data[: info.nbytes]

    def accept(self, frames: list[Any], info: BucketInfo, token: np.ndarray) -> None:
        progress = self._progress
        if progress.file is None:
            raise RuntimeError("a file sink is prepared before it accepts buckets")
        base = progress.base if progress.bucket_base(info.index) >= 0 else None
        self._check().check(frames, progress.version, info, token[: info.nbytes], base, progress.file)

    def release(self, token: np.ndarray) -> None:
        self._free.append(token)

    def close(self) -> None:
        if self._checker is not None:
            self._checker.close()
        self._stack.close()

    def _check(self) -> BucketChecker:
        if self._checker is None:
            raise RuntimeError("a file sink is prepared before it pulls")
        return self._checker
