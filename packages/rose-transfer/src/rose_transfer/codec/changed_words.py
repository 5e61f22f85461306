"""Which words of a buffer changed, fast: the comparison that a sparse patch starts from.

The naive ``np.flatnonzero(old != new)`` writes a boolean per element (half the model's bytes again
for bf16, into fresh pages) and then scans it. Here the buffers are compared as uint64 (four bf16 at
a time) in chunks that stay in cache, into one reused mask. A sparse chunk (few uint64 words differ)
yields the positions of its changed words, splitting only the differing uint64 words into their 2- or
4-byte lanes; a dense chunk yields its per-word mask instead, since its positions would cost more than
the bitmap they end up in. Vectorized numpy throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

CHUNK_WORDS64 = 1 << 17  # 1 MiB of each buffer per step
DENSE_WORDS = 1 / 8  # chunks with more changed words than this yield a mask: a bitmap beats positions there
WORD_DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(slots=True)
class ChangedChunk:
    """Words ``[first, first + count)`` of the buffer: either the sorted int64 ``positions`` (buffer
    indices) of those that changed, or a boolean ``mask`` over them (reused: valid until the next chunk)."""

    first: int
    count: int
    positions: np.ndarray | None = None
    mask: np.ndarray | None = None

    def changed_positions(self) -> np.ndarray:
        if self.positions is not None:
            return self.positions
        if self.mask is None:
            raise ValueError("a changed chunk holds positions or a mask")
        return np.flatnonzero(self.mask) + self.first


def word_view(buffer: np.ndarray, word_bytes: int) -> np.ndarray:
    """The whole words of a uint8 buffer as unsigned integers of ``word_bytes``."""
    usable = buffer.nbytes // word_bytes * word_bytes
    return buffer[:usable].view(WORD_DTYPES[word_bytes])


def changed_words(old: np.ndarray, new: np.ndarray, word_bytes: int) -> np.ndarray:
    """Sorted int64 indices of the ``word_bytes`` words that differ between two uint8 buffers."""
    found = [chunk.changed_positions() for chunk in iter_changed_chunks(old, new, word_bytes)]
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def iter_changed_chunks(old: np.ndarray, new: np.ndarray, word_bytes: int) -> Iterator[ChangedChunk]:
    """The chunks with changed words, in increasing order (chunks without changes are skipped)."""
    if old.nbytes != new.nbytes:
        raise ValueError(f"buffers differ in length: {old.nbytes} and {new.nbytes} bytes")
    if word_bytes not in WORD_DTYPES:
        raise ValueError(f"word_bytes must be one of {sorted(WORD_DTYPES)}, got {word_bytes}")
    wide = old.nbytes // 8
    yield from _changed_wide(old[: wide * 8].view(np.uint64), new[: wide * 8].view(np.uint64), word_bytes)
    rest = wide * (8 // word_bytes)
    old_words, new_words = word_view(old, word_bytes), word_view(new, word_bytes)
    tail = np.flatnonzero(old_words[rest:] != new_words[rest:])
    if tail.size:
        yield ChangedChunk(rest, old_words.size - rest, positions=tail + rest)


def _changed_wide(old64: np.ndarray, new64: np.ndarray, word_bytes: int) -> Iterator[ChangedChunk]:
    lanes = 8 // word_bytes
    shift = lanes.bit_length() - 1
    word = WORD_DTYPES[word_bytes]
    mask = np.empty(min(CHUNK_WORDS64, old64.size), dtype=bool)
    lane_mask = np.empty(mask.size * lanes, dtype=bool)
    dense_fraction = 1 - (1 - DENSE_WORDS) ** lanes  # of uint64 words, if changes are spread evenly
    for start in range(0, old64.size, CHUNK_WORDS64):
        a, b = old64[start : start + CHUNK_WORDS64], new64[start : start + CHUNK_WORDS64]
        chunk_mask = mask[: a.size]
        np.not_equal(a, b, out=chunk_mask)
        differing = np.count_nonzero(chunk_mask)
        if not differing:
            continue
        chunk = ChangedChunk(start << shift, a.size << shift)
        if lanes == 1:
            chunk.positions = np.flatnonzero(chunk_mask) + start
        elif differing > a.size * dense_fraction:
            chunk.mask = lane_mask[: a.size * lanes]
            np.not_equal(a.view(word), b.view(word), out=chunk.mask)
        else:
            wide = np.flatnonzero(chunk_mask)
            flat = np.flatnonzero((a[wide] ^ b[wide]).view(word) != 0)  # nonzero is fastest on booleans
            chunk.positions = ((wide[flat >> shift] + start) << shift) | (flat & (lanes - 1))
        yield chunk
