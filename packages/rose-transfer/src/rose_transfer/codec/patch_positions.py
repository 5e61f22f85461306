"""Where a bucket patch writes: the byte offsets of its changed words, O(changes), without applying it.

A receiver that keeps derived copies of its weights (an engine's packed kernels) redoes them only for
the tensors these offsets fall in."""

from __future__ import annotations

import numpy as np

from rose_transfer.codec.sparse_patch import parse_patch, patch_blocks


def changed_offsets(payload: np.ndarray, bucket_bytes: int) -> np.ndarray:
    """Byte offsets (within the bucket, int64, ascending) of the first byte of every word ``payload``
    overwrites, and of the tail bytes it always writes. ``PatchError`` for a payload that does not fit."""
    patch = parse_patch(payload, bucket_bytes)
    parts = [positions.astype(np.int64) * patch.word_bytes for positions, _ in patch_blocks(patch)]
    if patch.tail.nbytes:
        parts.append(np.arange(patch.n_words * patch.word_bytes, bucket_bytes, dtype=np.int64))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
