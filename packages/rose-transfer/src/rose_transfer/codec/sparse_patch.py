"""The ``patch`` bucket format: positions of the changed words and their NEW values.

Layout: a 32-byte header (magic, format, word bytes, position kind, bucket bytes, changed words,
position bytes), the positions (gap-coded LEB128 varints, byte gaps with escapes (``byte_gaps``), or
a bitmap of the bucket's words, whichever is smallest), the new values, then the bucket's last
``nbytes % word_bytes`` bytes raw.
The receiver writes the values over its copy of the base, so the result is bit-exact.

Encoding and decoding run chunk by chunk so that every intermediate array stays small and in cache
(fresh large temporaries cost a page fault per 4 KiB, which dominates naive implementations).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from rose_transfer.codec.byte_gaps import MAX_GAP, ByteGapsError, byte_gaps_bytes, decode_blocks, encode_codes
from rose_transfer.codec.changed_words import WORD_DTYPES, ChangedChunk, iter_changed_chunks, word_view
from rose_transfer.codec.varint import VarintError, decode_varints, encode_varints, varint_lengths

HEADER = struct.Struct("<4sBBBxQQQ")
_MAGIC = b"RSPB"
_FORMAT = 1
_VARINT, _BITMAP, _BYTE_GAPS = 0, 1, 2
_DECODE_BLOCK = 1 << 16  # varints per step of decoding
_GAPS_BLOCK = 1 << 14  # byte gaps per step of decoding: a block's span of the bucket stays in cache
_BITMAP_BLOCK = 1 << 19  # words per step of decoding a bitmap (a multiple of 8)
_TWO_BYTE_VARINT = 1 << 7  # the smallest gap that takes two varint bytes


class PatchError(ValueError):
    """A patch payload does not fit the base it is applied to (corrupt, truncated, or another bucket)."""


@dataclass(slots=True)
class _Part:
    """The changes of one chunk: new values and, for sparse chunks, the gaps between positions."""

    first: int
    count: int
    values: np.ndarray
    last: int  # the last changed position
    positions: np.ndarray | None = None  # sparse chunks only: dense ones live in the bucket's mask
    gaps: np.ndarray | None = None  # None for a dense chunk until exact gap codings are needed
    lengths: np.ndarray | None = None  # varint lengths of its gaps, once they are needed
    byte_gaps: int = 0  # bytes of its gaps as byte gaps (exact once ``gaps`` is set)
    long_gaps: int = 0  # gaps of two varint bytes or more (exact once ``gaps`` is set)


@dataclass(slots=True)
class _Changes:
    parts: list[_Part] = field(default_factory=list)
    count: int = 0
    varint_bytes: int = 0  # a lower bound until ``_exact_varint_bytes``: 1 per change, 2 per gap >= 128
    byte_gaps: int = 0  # the same for byte gaps
    mask: np.ndarray | None = None  # the bucket's word mask, holding the dense chunks' masks


def build_patch(base: np.ndarray, new: np.ndarray, word_bytes: int) -> np.ndarray | None:
    """The patch payload turning ``base`` into ``new`` (uint8 buffers), or None if dense is smaller."""
    n_words = new.nbytes // word_bytes
    bitmap_bytes = (n_words + 7) // 8
    fixed = HEADER.size + new.nbytes - n_words * word_bytes
    changes = _scan(base, new, word_bytes, limit=new.nbytes - fixed)
    if changes is None:
        return None
    gaps_allowed = n_words - 1 <= MAX_GAP
    byte_gaps = changes.byte_gaps if gaps_allowed else new.nbytes  # new.nbytes: never chosen
    if changes.mask is not None and min(changes.varint_bytes, byte_gaps) <= bitmap_bytes:
        _exact_gap_bytes(changes)  # the gap codings' sizes are lower bounds, and one might win
        byte_gaps = changes.byte_gaps if gaps_allowed else byte_gaps
    if changes.varint_bytes <= min(byte_gaps, bitmap_bytes):
        _exact_varint_bytes(changes)  # a lower bound so far, and it might win
    sizes = {_BYTE_GAPS: changes.byte_gaps, _VARINT: changes.varint_bytes, _BITMAP: bitmap_bytes}
    if not gaps_allowed:
        del sizes[_BYTE_GAPS]
    kind = min(sizes, key=lambda k: sizes[k])  # ties: byte gaps, the fastest to decode
    total = fixed + sizes[kind] + changes.count * word_bytes
    if total >= new.nbytes:
        return None
    payload = np.empty(total, dtype=np.uint8)
    header = HEADER.pack(_MAGIC, _FORMAT, word_bytes, kind, new.nbytes, changes.count, sizes[kind])
    payload[: HEADER.size] = np.frombuffer(header, dtype=np.uint8)
    cursor = _write_positions(payload, HEADER.size, kind, changes, n_words)
    for part in changes.parts:
        payload[cursor : cursor + part.values.nbytes] = part.values.view(np.uint8)
        cursor += part.values.nbytes
    payload[cursor:] = new[n_words * word_bytes :]
    return payload


def _write_positions(payload: np.ndarray, cursor: int, kind: int, changes: _Changes, n_words: int) -> int:
    """Write the positions section at ``cursor``, part by part (stays in cache); returns its end."""
    if kind == _BITMAP:
        bitmap = _bitmap(changes, n_words)
        payload[cursor : cursor + bitmap.nbytes] = bitmap
        return cursor + bitmap.nbytes
    escaped = []
    for part in changes.parts:
        if kind == _VARINT:
            encoded = encode_varints(_gaps(part), part.lengths)
        else:
            encoded, long_gaps = encode_codes(_gaps(part))
            escaped.append(long_gaps.view(np.uint8))
        payload[cursor : cursor + encoded.nbytes] = encoded
        cursor += encoded.nbytes
    for section in escaped:
        payload[cursor : cursor + section.nbytes] = section
        cursor += section.nbytes
    return cursor


def _gaps(part: _Part) -> np.ndarray:
    """A part's gaps, once they are exact (``_exact_gap_bytes`` sets those of dense parts first)."""
    if part.gaps is None:
        raise RuntimeError("a dense part's gaps are written before they were made exact (_exact_gap_bytes)")
    return part.gaps


def _scan(base: np.ndarray, new: np.ndarray, word_bytes: int, limit: int) -> _Changes | None:
    """Gather the changes; None as soon as even the smallest patch would reach ``limit``."""
    new_words = word_view(new, word_bytes)
    bitmap_bytes = (new_words.size + 7) // 8
    changes = _Changes()
    previous = -1
    for chunk in iter_changed_chunks(base, new, word_bytes):
        part = (
            _sparse_part(chunk, new_words, previous) if chunk.mask is None else _dense_part(chunk, new_words, changes)
        )
        changes.parts.append(part)
        changes.count += part.values.size
        changes.varint_bytes += part.values.size + (part.long_gaps if part.gaps is not None else 0)
        changes.byte_gaps += part.byte_gaps if part.gaps is not None else part.values.size
        previous = part.last
        if changes.count * word_bytes + min(changes.varint_bytes, changes.byte_gaps, bitmap_bytes) >= limit:
            return None
    return changes


def _sparse_part(chunk: ChangedChunk, new_words: np.ndarray, previous: int) -> _Part:
    positions = chunk.changed_positions()
    gaps = np.diff(positions, prepend=previous) - 1
    values = new_words[positions]
    part = _Part(chunk.first, chunk.count, values, int(positions[-1]), positions, gaps)
    part.byte_gaps = byte_gaps_bytes(gaps)
    part.long_gaps = int(np.count_nonzero(gaps >= _TWO_BYTE_VARINT))
    return part


def _dense_part(chunk: ChangedChunk, new_words: np.ndarray, changes: _Changes) -> _Part:
    mask = chunk.mask
    if mask is None:
        raise ValueError("a dense chunk carries its mask")
    if changes.mask is None:
        changes.mask = np.zeros(new_words.size, dtype=bool)
    window = slice(chunk.first, chunk.first + chunk.count)
    changes.mask[window] = mask
    values = np.compress(mask, new_words[window])  # several times faster than new_words[window][mask]
    return _Part(chunk.first, chunk.count, values, chunk.first + _last_true(mask))


def _last_true(mask: np.ndarray) -> int:
    """Index of the last True of a mask that has one (dense masks have it near the end)."""
    for span in (4096, mask.size):
        found = np.flatnonzero(mask[-span:])
        if found.size:
            return int(found[-1]) + max(mask.size - span, 0)
    raise ValueError("the mask has no True")


def _exact_gap_bytes(changes: _Changes) -> None:
    """Give dense parts their gaps, for when a gap coding might still beat the bitmap."""
    if changes.mask is None:
        return
    previous = -1
    for part in changes.parts:
        if part.gaps is None:
            positions = np.flatnonzero(changes.mask[part.first : part.first + part.count]) + part.first
            part.gaps = np.diff(positions, prepend=previous) - 1
            part.byte_gaps = byte_gaps_bytes(part.gaps)
            part.long_gaps = int(np.count_nonzero(part.gaps >= _TWO_BYTE_VARINT))
            changes.varint_bytes += part.long_gaps
            changes.byte_gaps += part.byte_gaps - part.values.size
        previous = part.last


def _exact_varint_bytes(changes: _Changes) -> int:
    """The exact bytes of every part's gaps as varints (each part's gaps made exact first)."""
    _exact_gap_bytes(changes)
    total = 0
    for part in changes.parts:
        part.lengths = varint_lengths(_gaps(part))
        total += int(part.lengths.sum(dtype=np.int64))
    changes.varint_bytes = total
    return total


def _bitmap(changes: _Changes, n_words: int) -> np.ndarray:
    mask = changes.mask if changes.mask is not None else np.zeros(n_words, dtype=bool)
    for part in changes.parts:
        if part.positions is not None:
            mask[part.positions] = True
    return np.packbits(mask, bitorder="little")


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
    if magic != _MAGIC or fmt != _FORMAT or word_bytes not in WORD_DTYPES or kind not in (_VARINT, _BITMAP, _BYTE_GAPS):
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
    if patch.kind == _BITMAP:
        return _bitmap_blocks(patch.positions, patch.count, patch.n_words, patch.values)
    if patch.kind == _BYTE_GAPS:
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
