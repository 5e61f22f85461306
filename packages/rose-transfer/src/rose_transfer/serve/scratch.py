"""Per-thread scratch buffers the publisher cuts view buckets into: a pair (a patch needs the base's
bucket and the new one), allocated and touched together on a worker thread's first use and reused by
every later version, so no version's bucket work takes fresh pages."""

from __future__ import annotations

import threading

import numpy as np

from rose_transfer.version.host_buffer import host_buffer

SLOTS = 2
_PAGE = 4096
_local = threading.local()


def scratch(slot: int, nbytes: int) -> np.ndarray:
    """This thread's buffer ``slot`` (0 or 1), at least ``nbytes`` long; valid until this thread asks
    for the same slot again."""
    buffers: list[np.ndarray] = _local.__dict__.setdefault("buffers", [])
    if not buffers or buffers[slot].nbytes < nbytes:
        buffers[:] = [_touched(nbytes) for _ in range(SLOTS)]
    return buffers[slot]


def _touched(nbytes: int) -> np.ndarray:
    buffer = host_buffer(nbytes)
    buffer[::_PAGE] = 0
    return buffer
