"""LEB128 varints of many unsigned integers at once, with numpy only (no per-element Python).

Encoding makes one pass per output byte position (at most 10 for 64-bit values, 4 for the gaps
between changed positions of a 64 MiB bucket), each over the values that are still that long.
"""

from __future__ import annotations

import numpy as np

MAX_VARINT_BYTES = 10


class VarintError(ValueError):
    """The bytes are not a sequence of the expected number of varints."""


def _narrow(values: np.ndarray) -> np.ndarray:
    """uint32 when every value fits (half the memory traffic), else uint64."""
    values = np.asarray(values)
    if values.dtype.kind not in "ui":
        raise VarintError(f"varints hold integers, not {values.dtype}")
    if values.size and (values.min() < 0 or values.max() > np.iinfo(np.uint32).max):
        return values.astype(np.uint64)
    return values.astype(np.uint32, copy=False)


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes each value takes as a varint (int8)."""
    values = _narrow(values)
    lengths = np.ones(values.size, dtype=np.int8)
    for k in range(1, MAX_VARINT_BYTES):
        longer = values >= values.dtype.type(1 << (7 * k)) if 7 * k < values.dtype.itemsize * 8 else None
        if longer is None or not longer.any():
            break
        lengths += longer
    return lengths


def encode_varints(values: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
    """The varints of ``values`` (non-negative integers), concatenated, as uint8.

    Byte ``j`` of every varint at least ``j + 1`` long is scattered to its place in one pass; each
    pass keeps only the values still that long (most gaps between changed positions take 1-2 bytes)."""
    values = _narrow(values)
    if lengths is None:
        lengths = varint_lengths(values)
    ends = np.cumsum(lengths, dtype=np.int64)
    out = np.empty(int(ends[-1]) if ends.size else 0, dtype=np.uint8)
    starts = ends - lengths
    one = values.dtype.type
    for j in range(int(lengths.max(initial=0))):
        if j:
            keep = np.flatnonzero(lengths > j)
            values, starts, lengths = values[keep], starts[keep], lengths[keep]
        group = ((values >> one(7 * j)) & one(0x7F)).astype(np.uint8)
        group |= (lengths > j + 1).view(np.uint8) << np.uint8(7)
        out[starts + j] = group
    return out


def decode_varints(data: np.ndarray, count: int) -> np.ndarray:
    """``count`` uint64 values from exactly the varints in ``data``; ``VarintError`` otherwise."""
    data = np.asarray(data, dtype=np.uint8)
    ends = np.flatnonzero(data < 0x80)
    if ends.size != count or (count and ends[-1] != data.size - 1) or (not count and data.size):
        raise VarintError(f"expected {count} varints in {data.size} bytes, found {ends.size}")
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if count and int(lengths.max()) > MAX_VARINT_BYTES:
        raise VarintError(f"a varint is longer than {MAX_VARINT_BYTES} bytes")
    values = (data[starts] & 0x7F).astype(np.uint64)
    index = np.arange(count)
    for j in range(1, int(lengths.max(initial=1))):
        index = index[lengths[index] > j]
        values[index] |= (data[starts[index] + j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    return values
