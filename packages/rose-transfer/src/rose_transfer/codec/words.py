"""Buffers as words: the unsigned integer types a bucket is compared and patched in."""

from __future__ import annotations

import numpy as np

WORD_DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def word_view(buffer: np.ndarray, word_bytes: int) -> np.ndarray:
    """The whole words of a uint8 buffer as unsigned integers of ``word_bytes``."""
    usable = buffer.nbytes // word_bytes * word_bytes
    return buffer[:usable].view(WORD_DTYPES[word_bytes])
