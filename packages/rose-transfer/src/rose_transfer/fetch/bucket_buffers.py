"""Receive buffers a fetcher reuses across fetches: ``window`` buckets, touched once, so receiving
never pays for fresh pages. A verified bucket is written from its buffer into the version's file.
A fetch holds the set while it runs; a concurrent fetch on the same fetcher gets its own set."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


class BucketBuffers:
    def __init__(self) -> None:
        self._idle: list[np.ndarray] = []

    @contextmanager
    def lend(self, count: int, nbytes: int) -> Iterator[list[np.ndarray]]:
        """``count`` buffers of at least ``nbytes`` (uint8) for one fetch; kept for the next one."""
        buffers, self._idle = self._idle, []
        if len(buffers) != count or (buffers and buffers[0].nbytes < nbytes):
            buffers = [_touched(nbytes) for _ in range(count)]
        try:
            yield buffers
        finally:
            self._idle = buffers


def _touched(nbytes: int) -> np.ndarray:
    buffer = np.empty(nbytes, dtype=np.uint8)
    buffer[::4096] = 0  # fault every page in now, not while receiving
    return buffer
