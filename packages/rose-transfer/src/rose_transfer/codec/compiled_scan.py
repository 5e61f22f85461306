"""The changed-word scan of a patch, compiled (numba): the publisher's hot loop, with the GIL released.

A patch starts from the words of a bucket that differ between the base and the new version. Here one
pass reads both versions where they lie, run by run (a run is ``n`` words at ``src`` in both streams,
landing at word ``dst`` of the bucket), so a shard view's bucket is scanned straight from the whole
streams without being cut first. Runs come in increasing ``dst`` order and do not overlap.

Per run the words are compared eight bytes at a time; the differing uint64 words are gathered
branch-free, then split into their lanes, also branch-free (a position and a value are written for
every lane and the count advances only for a changed one, so ``positions`` and ``values`` need
``lanes`` spare slots). Two regimes:

- sparse: positions are kept (int64), for gap codings;
- bitmap: once more words changed than the bitmap has bytes (every gap coding then takes more than
  the bitmap), the positions so far are turned into bits and later changes set bits directly.

The scan stops early (returns -1) once ``k_max`` words changed: no patch can then be smaller than the
bucket. Nothing here allocates; the caller owns every buffer (``codec/scan_buffers.py``).

This is the only module that imports numba (mypy sees its kernels through the typed names at the end). Kernels compile on first use (and are cached on disk);
``warm_up()`` compiles them ahead, as a publisher does when it starts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import cast

import numba
import numpy as np

if sys.byteorder != "little":  # lane 0 of a uint64 is the word at its lowest address only on little-endian hosts
    raise ImportError("rose-transfer's patch encoder needs a little-endian host (x86-64 or arm64)")

SPARSE, BITMAP = 0, 1
WIDE_BLOCK = 4096  # uint64 words gathered per step (``wide`` holds that many indices)

_jit = numba.njit(nogil=True, cache=True, boundscheck=False)
_inline = numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")


@_jit
def _scan(
    old: np.ndarray,
    new: np.ndarray,
    old64: np.ndarray,
    new64: np.ndarray,
    runs: np.ndarray,
    positions: np.ndarray,
    values: np.ndarray,
    bitmap: np.ndarray,
    wide: np.ndarray,
    sparse_cap: int,
    k_max: int,
) -> tuple[int, int]:
    lanes = 8 // old.itemsize
    bits = np.uint64(8 * old.itemsize)
    lane_mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - 8 * old.itemsize)
    k, mode = 0, SPARSE
    for r in range(runs.shape[0]):
        src, dst, n = runs[r, 0], runs[r, 1], runs[r, 2]
        j = 0
        while j < n and (src + j) % lanes != 0:  # head: up to the first whole uint64
            k, mode = _emit(new[src + j], old[src + j] != new[src + j], dst + j, k, mode, positions, values, bitmap)
            j += 1
        body = (n - j) // lanes
        first = (src + j) // lanes
        for block in range(0, body, WIDE_BLOCK):
            m = 0
            for i in range(block, min(block + WIDE_BLOCK, body)):
                wide[m] = i
                m += old64[first + i] != new64[first + i]
            for t in range(m):
                i = wide[t]
                x = old64[first + i] ^ new64[first + i]
                at = j + i * lanes
                for lane in range(lanes):
                    changed = ((x >> (bits * np.uint64(lane))) & lane_mask) != 0
                    k, mode = _emit(new[src + at + lane], changed, dst + at + lane, k, mode, positions, values, bitmap)
                if k >= sparse_cap and mode == SPARSE:
                    _write_bitmap(positions, k, bitmap)
                    mode = BITMAP
                if k >= k_max:
                    return -1, mode
        j += body * lanes
        while j < n:  # tail
            k, mode = _emit(new[src + j], old[src + j] != new[src + j], dst + j, k, mode, positions, values, bitmap)
            j += 1
        if k >= sparse_cap and mode == SPARSE:
            _write_bitmap(positions, k, bitmap)
            mode = BITMAP
        if k >= k_max:
            return -1, mode
    return k, mode


@_inline
def _emit(
    word: np.generic,
    changed: bool,
    at: int,
    k: int,
    mode: int,
    positions: np.ndarray,
    values: np.ndarray,
    bitmap: np.ndarray,
) -> tuple[int, int]:
    """Record word ``at`` (its new value ``word``) if ``changed``, without a branch on ``changed``."""
    values[k] = word
    if mode == SPARSE:
        positions[k] = at
    else:
        bitmap[at >> 3] |= np.uint8(changed) << np.uint8(at & 7)
    return k + int(changed), mode


@_jit
def _gap_sizes(positions: np.ndarray, k: int) -> tuple[int, int]:
    """``(gaps of 255 or more, bytes of every gap as LEB128)`` for sorted ``positions[:k]``."""
    escaped, varint, previous = 0, 0, -1
    for i in range(k):
        gap = positions[i] - previous - 1
        escaped += gap >= 255
        length = 1
        while gap >= 128:
            gap >>= 7
            length += 1
        varint += length
        previous = positions[i]
    return escaped, varint


@_jit
def _write_byte_gaps(positions: np.ndarray, k: int, out: np.ndarray) -> None:
    """The byte-gap section (``codec/byte_gaps.py``) of ``positions[:k]`` into ``out`` (uint8, exact size)."""
    escape_at, previous = k, -1
    for i in range(k):
        gap = positions[i] - previous - 1
        if gap < 255:
            out[i] = gap
        else:
            out[i] = 255
            for b in range(4):  # little-endian uint32 after the codes
                out[escape_at + b] = (gap >> (8 * b)) & 0xFF
            escape_at += 4
        previous = positions[i]


@_jit
def _write_bitmap(positions: np.ndarray, k: int, out: np.ndarray) -> None:
    """The bitmap of ``positions[:k]`` into ``out`` (uint8, one bit per word of the bucket)."""
    out[:] = 0
    for i in range(k):
        p = positions[i]
        out[p >> 3] |= np.uint8(1) << np.uint8(p & 7)


scan_runs = cast(Callable[..., tuple[int, int]], _scan)
"""``scan_runs(old, new, old64, new64, runs, positions, values, bitmap, wide, sparse_cap, k_max)``:
``(changed words, SPARSE or BITMAP)``, or ``(-1, mode)`` once ``k_max`` changed (dense is smaller)."""
gap_sizes = cast(Callable[[np.ndarray, int], tuple[int, int]], _gap_sizes)
write_byte_gaps = cast(Callable[[np.ndarray, int, np.ndarray], None], _write_byte_gaps)
write_bitmap = cast(Callable[[np.ndarray, int, np.ndarray], None], _write_bitmap)


def warm_up() -> None:
    """Compile (or load from the disk cache) every kernel for every word width, on tiny buffers."""
    runs = np.array([[0, 0, 16]], dtype=np.int64)
    positions, bitmap, wide = np.zeros(32, np.int64), np.zeros(4, np.uint8), np.zeros(WIDE_BLOCK, np.int64)
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        old, new = np.zeros(16, dtype), np.ones(16, dtype)
        scan_runs(old, new, old.view(np.uint64), new.view(np.uint64), runs, positions, np.zeros(32, dtype), bitmap,
                  wide, 4, 24)
    gap_sizes(positions, 2)
    write_byte_gaps(positions, 0, bitmap)
    write_bitmap(positions, 0, bitmap)
