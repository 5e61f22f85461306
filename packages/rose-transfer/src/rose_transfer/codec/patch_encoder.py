"""Encoding a ``patch`` (format: ``sparse_patch``): one compiled scan of the changed words, then the
smallest position coding written straight into the payload.

``build_patch`` encodes two contiguous buckets; ``build_patch_runs`` encodes a bucket that lies in runs
of two whole streams (a shard view's bucket: rows of the version's tensors), reading them in place, so
the view is never cut into a buffer first. Both give the same payload for the same bucket bytes.

The coding is chosen by exact size, ties in the order byte gaps, varints, bitmap; the patch only when
it is smaller than the bucket (None otherwise: send it dense).
"""

from __future__ import annotations

import numpy as np

from rose_transfer.codec.byte_gaps import EXCEPTION_BYTES, MAX_GAP
from rose_transfer.codec.compiled_scan import BITMAP as SCANNED_TO_BITMAP
from rose_transfer.codec.compiled_scan import gap_sizes, scan_runs, warm_up, write_bitmap, write_byte_gaps
from rose_transfer.codec.scan_buffers import ScanBuffers, scan_buffers
from rose_transfer.codec.sparse_patch import BITMAP, BYTE_GAPS, FORMAT, HEADER, MAGIC, VARINT
from rose_transfer.codec.varint import encode_varints
from rose_transfer.codec.words import WORD_DTYPES, word_view


def build_patch(base: np.ndarray, new: np.ndarray, word_bytes: int) -> np.ndarray | None:
    """The patch payload turning ``base`` into ``new`` (uint8 buffers), or None if dense is smaller."""
    if base.nbytes != new.nbytes:
        raise ValueError(f"buffers differ in length: {base.nbytes} and {new.nbytes} bytes")
    _check_word_bytes(word_bytes)
    n_words = new.nbytes // word_bytes
    runs = np.array([[0, 0, n_words]], dtype=np.int64)
    return _encode(base, new, runs, n_words, word_bytes, new[n_words * word_bytes :])


def build_patch_runs(
    base: np.ndarray, new: np.ndarray, runs: np.ndarray, nbytes: int, word_bytes: int
) -> np.ndarray | None:
    """The patch of a bucket of ``nbytes`` made of ``runs`` of the streams ``base`` and ``new`` (uint8,
    same length): rows ``(src, dst, n)`` in words, ``n`` words at word ``src`` of each stream landing at
    word ``dst`` of the bucket, in increasing ``dst`` and not overlapping; the bucket's other words are
    the same in both versions (padding). ``ValueError`` for runs outside the streams or the bucket."""
    if base.nbytes != new.nbytes:
        raise ValueError(f"streams differ in length: {base.nbytes} and {new.nbytes} bytes")
    _check_word_bytes(word_bytes)
    if nbytes % word_bytes:
        raise ValueError(f"a bucket of {nbytes} bytes is not whole {word_bytes}-byte words")
    _check_runs(runs, base.nbytes // word_bytes, nbytes // word_bytes)
    return _encode(base, new, runs, nbytes // word_bytes, word_bytes, new[:0])


def prepare(bucket_bytes: int, word_bytes: int = 2) -> None:
    """Ready this thread to encode buckets of up to ``bucket_bytes`` (of ``word_bytes`` words, the narrowest
    a version has): the kernels compiled (or loaded from the disk cache) and its scan buffers sized for the
    densest patch such a bucket can have, their pages faulted in."""
    warm_up()
    n_words = bucket_bytes // word_bytes
    bitmap_bytes = (n_words + 7) // 8
    k_max = _dense_from(bucket_bytes - HEADER.size, word_bytes, bitmap_bytes)
    scan_buffers(bitmap_bytes + 1, max(k_max, 0), word_bytes, bitmap_bytes).touch()


def _check_word_bytes(word_bytes: int) -> None:
    if word_bytes not in WORD_DTYPES:
        raise ValueError(f"word_bytes must be one of {sorted(WORD_DTYPES)}, got {word_bytes}")


def _check_runs(runs: np.ndarray, stream_words: int, n_words: int) -> None:
    """The scan trusts its runs (no bounds checks inside): check every one here."""
    if runs.ndim != 2 or runs.shape[1] != 3 or runs.dtype != np.int64:
        raise ValueError("runs are an int64 array of (src, dst, n) rows")
    src, dst, n = runs[:, 0], runs[:, 1], runs[:, 2]
    if runs.size and ((n < 0).any() or (src < 0).any() or (dst < 0).any()):
        raise ValueError("runs must not be negative")
    if runs.size and ((src + n).max() > stream_words or (dst + n).max() > n_words):
        raise ValueError("a run reaches past the streams or the bucket")
    if (dst[1:] < dst[:-1] + n[:-1]).any():
        raise ValueError("runs must come in increasing bucket order without overlapping")


def _encode(
    base: np.ndarray, new: np.ndarray, runs: np.ndarray, n_words: int, word_bytes: int, tail: np.ndarray
) -> np.ndarray | None:
    bitmap_bytes = (n_words + 7) // 8
    nbytes = n_words * word_bytes + tail.nbytes
    fixed = HEADER.size + tail.nbytes
    k_max = _dense_from(nbytes - fixed, word_bytes, bitmap_bytes)
    if k_max <= 0:
        return None
    buffers = scan_buffers(bitmap_bytes + 1, k_max, word_bytes, bitmap_bytes)
    count, regime = _scan(base, new, runs, word_bytes, buffers, bitmap_bytes, k_max)
    if count < 0:
        return None
    positions = buffers.positions
    if regime == SCANNED_TO_BITMAP:  # more changes than bitmap bytes: every gap coding is larger
        kind, position_bytes = BITMAP, bitmap_bytes
    else:
        kind, position_bytes = _smallest_coding(positions, count, n_words, bitmap_bytes)
    total = fixed + position_bytes + count * word_bytes
    if total >= nbytes:
        return None
    payload = np.empty(total, dtype=np.uint8)
    header = HEADER.pack(MAGIC, FORMAT, word_bytes, kind, nbytes, count, position_bytes)
    payload[: HEADER.size] = np.frombuffer(header, dtype=np.uint8)
    section = payload[HEADER.size : HEADER.size + position_bytes]
    if kind == BYTE_GAPS:
        write_byte_gaps(positions, count, section)
    elif kind == VARINT:
        section[:] = encode_varints(np.diff(positions[:count], prepend=-1) - 1)
    elif regime == SCANNED_TO_BITMAP:
        section[:] = buffers.bitmap[:bitmap_bytes]
    else:
        write_bitmap(positions, count, section)
    values_at = HEADER.size + position_bytes
    payload[values_at : values_at + count * word_bytes] = buffers.values[: count * word_bytes]
    payload[values_at + count * word_bytes :] = tail
    return payload


def _scan(
    base: np.ndarray,
    new: np.ndarray,
    runs: np.ndarray,
    word_bytes: int,
    buffers: ScanBuffers,
    bitmap_bytes: int,
    k_max: int,
) -> tuple[int, int]:
    wide = base.nbytes // 8 * 8
    return scan_runs(
        word_view(base, word_bytes),
        word_view(new, word_bytes),
        base[:wide].view(np.uint64),
        new[:wide].view(np.uint64),
        runs,
        buffers.positions,
        buffers.values.view(WORD_DTYPES[word_bytes]),
        buffers.bitmap[:bitmap_bytes],
        buffers.wide,
        bitmap_bytes + 1,
        k_max,
    )


def _smallest_coding(positions: np.ndarray, count: int, n_words: int, bitmap_bytes: int) -> tuple[int, int]:
    """``(coding, bytes)`` of the smallest position coding; ties go to byte gaps, then varints."""
    escaped, varint_bytes = gap_sizes(positions, count)
    sizes = {VARINT: varint_bytes, BITMAP: bitmap_bytes}
    if n_words - 1 <= MAX_GAP:  # byte gaps escape to a uint32
        sizes = {BYTE_GAPS: count + EXCEPTION_BYTES * escaped, **sizes}
    kind = min(sizes, key=lambda k: sizes[k])
    return kind, sizes[kind]


def _dense_from(limit: int, word_bytes: int, bitmap_bytes: int) -> int:
    """The fewest changed words with which no patch fits in ``limit`` bytes: values take ``word_bytes``
    each, and positions at least one byte each (any gap coding) or the bitmap."""
    if limit <= 0:
        return 0
    k = -(-limit // (word_bytes + 1))
    if k <= bitmap_bytes:
        return k
    return max(bitmap_bytes + 1, -(-(limit - bitmap_bytes) // word_bytes))
