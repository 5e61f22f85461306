"""Apply one bucket's patch to resident weights in place, logging the old words it overwrites."""

from __future__ import annotations

import numpy as np

from rose_transfer.changed_words import word_view
from rose_transfer.sparse_patch import parse_patch, patch_blocks
from rose_transfer.undo_log import UndoLog


def patch_in_place(payload: np.ndarray, bucket: np.ndarray, undo: UndoLog) -> None:
    """Write the new words of ``payload`` over ``bucket`` (uint8, the held base). Raises ``PatchError``
    for a payload that does not fit; whatever it wrote before that is in ``undo``."""
    patch = parse_patch(payload, bucket.nbytes)
    words = word_view(bucket, patch.word_bytes)
    for positions, values in patch_blocks(patch):
        undo.overwrite(words, positions, values)
    if patch.tail.nbytes:
        undo.overwrite(bucket, slice(patch.n_words * patch.word_bytes, None), patch.tail)
