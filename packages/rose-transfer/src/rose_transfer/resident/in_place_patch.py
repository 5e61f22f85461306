"""Apply one bucket's patch to resident weights in place, logging the old words it overwrites, and
checksum the patched bucket on the way: each block's span is hashed right after it is written, while
it is still in cache, so the bucket is read from memory once rather than twice."""

from __future__ import annotations

import numpy as np

from rose_transfer.codec.sparse_patch import parse_patch, patch_blocks
from rose_transfer.codec.words import word_view
from rose_transfer.resident.undo_log import UndoLog
from rose_transfer.version.manifest import checksum_stream


def patch_in_place(payload: np.ndarray, bucket: np.ndarray, undo: UndoLog) -> str:
    """Write the new words of ``payload`` over ``bucket`` (uint8, the held base); returns the patched
    bucket's checksum. Raises ``PatchError`` for a payload that does not fit; whatever it wrote before
    that is in ``undo``."""
    patch = parse_patch(payload, bucket.nbytes)
    words = word_view(bucket, patch.word_bytes)
    entry = undo.begin(words, patch)
    checksum, hashed = checksum_stream(), 0
    for positions, values in patch_blocks(patch):
        undo.overwrite(entry, positions, values)
        end = (int(positions[-1]) + 1) * patch.word_bytes
        checksum.update(bucket[hashed:end])
        hashed = end
    if patch.tail.nbytes:
        undo.overwrite_tail(entry, bucket[patch.n_words * patch.word_bytes :], patch.tail)
    checksum.update(bucket[hashed:])
    return str(checksum.hexdigest())
