"""``ScanBuffers``: the buffers one thread's patch encoder scans into, kept and reused across buckets and
versions (grown when a larger bucket comes), so encoding takes no fresh pages after the first bucket.

Sizes for a bucket of ``n`` words of ``w`` bytes: positions ``n / 8 + 1`` int64 (the sparse regime ends
once more words changed than the bitmap has bytes), values ``n`` words, the bitmap ``n / 8`` bytes:
about ``(2 + w) n`` bytes, 128 MiB per thread for a 64 MiB bucket of bf16."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from rose_transfer.codec.compiled_scan import WIDE_BLOCK

_PAGE = 4096
SPARE = 16  # the scan writes up to two uint64 words' lanes past the count between its checks
_local = threading.local()


@dataclass(slots=True)
class ScanBuffers:
    positions: np.ndarray  # int64
    values: np.ndarray  # uint8 of whole uint64s, viewed as the word type
    bitmap: np.ndarray  # uint8
    wide: np.ndarray  # int64, WIDE_BLOCK

    def touch(self) -> None:
        """Fault every page in now (a first scan would otherwise pay for fresh pages: 0.5-0.8 s per 300 MB
        on a VM that hands freed memory back to its host)."""
        for array in (self.positions, self.values, self.bitmap, self.wide):
            array.view(np.uint8)[::_PAGE] = 0

    def fits(self, sparse_cap: int, k_max: int, word_bytes: int, bitmap_bytes: int) -> bool:
        return (
            self.positions.size >= sparse_cap + SPARE
            and self.values.nbytes >= (k_max + SPARE) * word_bytes
            and self.bitmap.nbytes >= bitmap_bytes
        )


def scan_buffers(sparse_cap: int, k_max: int, word_bytes: int, bitmap_bytes: int) -> ScanBuffers:
    """This thread's buffers, large enough for a scan with these bounds."""
    held: ScanBuffers | None = getattr(_local, "buffers", None)
    if held is None or not held.fits(sparse_cap, k_max, word_bytes, bitmap_bytes):
        held = _local.buffers = ScanBuffers(
            positions=np.empty(sparse_cap + SPARE, dtype=np.int64),
            values=np.empty(-(-(k_max + SPARE) * word_bytes // 8), dtype=np.uint64).view(np.uint8),  # any word type
            bitmap=np.empty(max(bitmap_bytes, 1), dtype=np.uint8),
            wide=np.empty(WIDE_BLOCK, dtype=np.int64),
        )
    return held
