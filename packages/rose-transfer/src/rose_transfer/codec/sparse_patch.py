"""The ``patch`` bucket format: positions of the changed words and their NEW values.

Layout: a 32-byte header (magic, format, word bytes, position kind, bucket bytes, changed words,
position bytes), the positions (gap-coded LEB128 varints, byte gaps with escapes (``byte_gaps``), or
a bitmap of the bucket's words, whichever is smallest), the new values, then the bucket's last
``nbytes % word_bytes`` bytes raw.
The receiver writes the values over its copy of the base, so the result is bit-exact.

This module holds the format and the decoder (numpy, block by block so that every intermediate array
stays small and in cache); the encoder is ``patch_encoder`` (a compiled scan, on the publisher).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rose_transfer.codec.byte_gaps import ByteGapsError, decode_blocks
from rose_transfer.codec.varint import VarintError, decode_varints
from rose_transfer.codec.words import WORD_DTYPES, word_view

HEADER = struct.Struct("<4sBBBxQQQ")
MAGIC = b"RSPB"
FORMAT = 1
VARINT, BITMAP, BYTE_GAPS = 0, 1, 2  # position codings
_DECODE_BLOCK = 1 << 16  # varints per step of decoding
_GAPS_BLOCK = 1 << 14  # byte gaps per step of decoding: a block's span of the bucket stays in cache
_BITMAP_BLOCK = 1 << 19  # words per step of decoding a bitmap (a multiple of 8)


class PatchError(ValueError):
    """A patch payload does not fit the base it is applied to (corrupt, truncated, or another bucket)."""


@dataclass(slots=True, frozen=True)
class ParsedPatch:
    """A patch payload cut into its sections (checked against the bucket size, not yet decoded)."""

    word_bytes: int
    kind: int
    count: int
    n_words: int
    positions: np.ndarray  # varints or bitmap (uint8)
    values: np.ndarray  # the new words
    tail: np.ndarray  # the bucket's last ``nbytes % word_bytes`` bytes


def apply_patch(payload: np.ndarray, base: np.ndarray, out: np.ndarray) -> None:
    """Write ``base`` patched by ``payload`` into ``out`` (uint8; ``out`` may be ``base`` itself)."""
    patch = parse_patch(payload, base.nbytes)
    if out is not base:
        out[:] = base
    out_words = word_view(out, patch.word_bytes)
    for positions, values in patch_blocks(patch):
        out_words[positions] = values
    out[patch.n_words * patch.word_bytes :] = patch.tail


def parse_patch(payload: np.ndarray, base_bytes: int) -> ParsedPatch:
    """The sections of ``payload`` for a bucket of ``base_bytes``; ``PatchError`` if they do not fit."""
    if payload.nbytes < HEADER.size:
        raise PatchError(f"patch of {payload.nbytes} bytes is shorter than its header")
    magic, fmt, word_bytes, kind, nbytes, count, position_bytes = HEADER.unpack(payload[: HEADER.size].tobytes())
    if magic != MAGIC or fmt != FORMAT or word_bytes not in WORD_DTYPES or kind not in (VARINT, BITMAP, BYTE_GAPS):
        raise PatchError("not a patch this rose-transfer can read (bad header): install one version on both ends")
    n_words = nbytes // word_bytes
    value_bytes = count * word_bytes
    if nbytes != base_bytes or count > n_words:
        raise PatchError(f"patch for a {nbytes}-byte bucket does not fit this {base_bytes}-byte base")
    if payload.nbytes != HEADER.size + position_bytes + value_bytes + nbytes - n_words * word_bytes:
        raise PatchError(f"patch of {payload.nbytes} bytes does not match its header")
    values_at = HEADER.size + position_bytes
    return ParsedPatch(
        word_bytes=word_bytes,
        kind=kind,
        count=count,
        n_words=n_words,
        positions=payload[HEADER.size : values_at],
        values=payload[values_at : values_at + value_bytes].view(WORD_DTYPES[word_bytes]),
        tail=payload[values_at + value_bytes :],
    )


def overwritten_bytes(payload: np.ndarray) -> int:
    """Bytes of the words a patch overwrites, from its header (0 for one too short to have a header)."""
    if payload.nbytes < HEADER.size:
        return 0
    _, _, word_bytes, _, _, count, _ = HEADER.unpack(payload[: HEADER.size].tobytes())
    return int(word_bytes * count)


def patch_blocks(patch: ParsedPatch) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(word positions, new words)`` block by block, every block checked before it is yielded
    (a corrupt block raises ``PatchError``; earlier blocks were already yielded)."""
    if patch.kind == BITMAP:
        return _bitmap_blocks(patch.positions, patch.count, patch.n_words, patch.values)
    if patch.kind == BYTE_GAPS:
        return _byte_gap_blocks(patch.positions, patch.count, patch.n_words, patch.values)
    return _varint_blocks(patch.positions, patch.count, patch.n_words, patch.values)


def _bitmap_blocks(
    data: np.ndarray, count: int, n_words: int, values: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    if data.nbytes != (n_words + 7) // 8:
        raise PatchError("patch bitmap does not match the bucket size")
    done = 0
    for first in range(0, n_words, _BITMAP_BLOCK):  # block by block: no bucket-sized temporaries
        last = min(first + _BITMAP_BLOCK, n_words)
        bits = np.unpackbits(data[first // 8 : (last + 7) // 8], count=last - first, bitorder="little")
        positions = np.flatnonzero(bits.view(bool))  # nonzero is several times faster on booleans
        if done + positions.size > count:
            raise PatchError(f"patch bitmap marks more words than its header's {count}")
        if positions.size:
            yield positions + first, values[done : done + positions.size]
        done += positions.size
    if done != count:
        raise PatchError(f"patch bitmap marks {done} words, its header {count}")


def _byte_gap_blocks(
    data: np.ndarray, count: int, n_words: int, values: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Positions come in one reused buffer: each block is used before the next is decoded."""
    first = 0
    try:
        for positions in decode_blocks(data, count, n_words, _GAPS_BLOCK):
            yield positions, values[first : first + positions.size]
            first += positions.size
    except ByteGapsError as exc:
        raise PatchError(f"patch positions are corrupt: {exc}") from None


def _varint_blocks(
    data: np.ndarray, count: int, n_words: int, values: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    ends = np.flatnonzero(data < 0x80)
    if ends.size != count or (count and ends[-1] != data.size - 1) or (not count and data.size):
        raise PatchError(f"patch positions hold {ends.size} varints, its header says {count}")
    previous, start = -1, 0
    for first in range(0, count, _DECODE_BLOCK):
        last = min(first + _DECODE_BLOCK, count)
        stop = int(ends[last - 1]) + 1
        try:
            gaps = decode_varints(data[start:stop], last - first)
        except VarintError as exc:
            raise PatchError(f"patch positions are corrupt: {exc}") from exc
        if int(gaps.max()) >= n_words:
            raise PatchError("patch positions run past the bucket")
        positions = previous + np.cumsum(gaps.astype(np.int64) + 1)
        if positions[-1] >= n_words:
            raise PatchError("patch positions run past the bucket")
        yield positions, values[first:last]
        previous, start = int(positions[-1]), stop
