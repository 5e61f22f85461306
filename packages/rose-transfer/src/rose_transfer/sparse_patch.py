"""The ``patch`` bucket format: positions of the changed words and their NEW values.

Layout: a 32-byte header (magic, format, word bytes, position kind, bucket bytes, changed words,
position bytes), the positions (gap-coded LEB128 varints, or a bitmap of the bucket's words,
whichever is smaller), the new values, then the bucket's last ``nbytes % word_bytes`` bytes raw.
The receiver writes the values over its copy of the base, so the result is bit-exact.

Encoding and decoding run chunk by chunk so that every intermediate array stays small and in cache
(fresh large temporaries cost a page fault per 4 KiB, which dominates naive implementations).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from rose_transfer.changed_words import WORD_DTYPES, ChangedChunk, iter_changed_chunks, word_view
from rose_transfer.varint import VarintError, decode_varints, encode_varints, varint_lengths

HEADER = struct.Struct("<4sBBBxQQQ")
_MAGIC = b"RSPB"
_FORMAT = 1
_VARINT, _BITMAP = 0, 1
_DECODE_BLOCK = 1 << 16  # varints per step of decoding
_BITMAP_BLOCK = 1 << 19  # words per step of decoding a bitmap (a multiple of 8)


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
    gaps: np.ndarray | None = None  # None for a dense chunk until exact varint sizes are needed
    lengths: np.ndarray | None = None


@dataclass(slots=True)
class _Changes:
    parts: list[_Part] = field(default_factory=list)
    count: int = 0
    varint_bytes: int = 0  # exact for sparse parts, 1 per change (a lower bound) for dense ones
    mask: np.ndarray | None = None  # the bucket's word mask, holding the dense chunks' masks


def build_patch(base: np.ndarray, new: np.ndarray, word_bytes: int) -> np.ndarray | None:
    """The patch payload turning ``base`` into ``new`` (uint8 buffers), or None if dense is smaller."""
    n_words = new.nbytes // word_bytes
    bitmap_bytes = (n_words + 7) // 8
    fixed = HEADER.size + new.nbytes - n_words * word_bytes
    changes = _scan(base, new, word_bytes, limit=new.nbytes - fixed)
    if changes is None:
        return None
    if changes.mask is not None and changes.varint_bytes < bitmap_bytes:
        _exact_varint_bytes(changes)
    position_bytes = min(changes.varint_bytes, bitmap_bytes)
    total = fixed + position_bytes + changes.count * word_bytes
    if total >= new.nbytes:
        return None
    kind = _VARINT if changes.varint_bytes <= bitmap_bytes else _BITMAP
    payload = np.empty(total, dtype=np.uint8)
    header = HEADER.pack(_MAGIC, _FORMAT, word_bytes, kind, new.nbytes, changes.count, position_bytes)
    payload[: HEADER.size] = np.frombuffer(header, dtype=np.uint8)
    cursor = HEADER.size
    if kind == _VARINT:
        for part in changes.parts:  # chunk by chunk: stays in cache
            encoded = encode_varints(part.gaps, part.lengths)  # type: ignore[arg-type]
            payload[cursor : cursor + encoded.nbytes] = encoded
            cursor += encoded.nbytes
    else:
        payload[cursor : cursor + position_bytes] = _bitmap(changes, n_words)
        cursor += position_bytes
    for part in changes.parts:
        payload[cursor : cursor + part.values.nbytes] = part.values.view(np.uint8)
        cursor += part.values.nbytes
    payload[cursor:] = new[n_words * word_bytes :]
    return payload


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
        changes.varint_bytes += int(part.lengths.sum(dtype=np.int64)) if part.lengths is not None else part.values.size
        previous = part.last
        if changes.count * word_bytes + min(changes.varint_bytes, bitmap_bytes) >= limit:
            return None
    return changes


def _sparse_part(chunk: ChangedChunk, new_words: np.ndarray, previous: int) -> _Part:
    positions = chunk.changed_positions()
    gaps = np.diff(positions, prepend=previous) - 1
    values = new_words[positions]
    return _Part(chunk.first, chunk.count, values, int(positions[-1]), positions, gaps, varint_lengths(gaps))


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


def _exact_varint_bytes(changes: _Changes) -> None:
    """Give dense parts their gaps, for when varints might still beat the bitmap."""
    if changes.mask is None:
        return
    previous = -1
    for part in changes.parts:
        if part.gaps is None:
            positions = np.flatnonzero(changes.mask[part.first : part.first + part.count]) + part.first
            part.gaps = np.diff(positions, prepend=previous) - 1
            part.lengths = varint_lengths(part.gaps)
            changes.varint_bytes += int(part.lengths.sum(dtype=np.int64)) - part.values.size
        previous = part.last


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
    if magic != _MAGIC or fmt != _FORMAT or word_bytes not in WORD_DTYPES or kind not in (_VARINT, _BITMAP):
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


def patch_blocks(patch: ParsedPatch) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(word positions, new words)`` block by block, every block checked before it is yielded
    (a corrupt block raises ``PatchError``; earlier blocks were already yielded)."""
    if patch.kind == _BITMAP:
        return _bitmap_blocks(patch.positions, patch.count, patch.n_words, patch.values)
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
