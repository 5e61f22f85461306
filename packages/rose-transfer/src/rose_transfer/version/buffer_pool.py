"""``BufferPool``: host buffers recycled once nothing references them, so that each new version a
publisher builds lands in pages already faulted in (fresh pages cost 0.5-0.8 s per 300 MB on this VM).

A buffer goes back to the pool only when the array handed out has been freed. Every numpy view,
slice, ``memoryview`` or frame derived from that array keeps it alive (numpy's views of an array
made from a foreign buffer reference that array, not the buffer), so a recycled buffer never aliases
bytes anyone can still read or send: a version still served, or a reply still being written, keeps
its buffer out of the pool. A reference cycle only delays the recycling (the pool then allocates).
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

from rose_transfer.version.host_buffer import host_region

FREE_BYTES_PER_SIZE = 1 << 30  # free buffers kept per size: this many bytes, and at least two


class BufferPool:
    """Thread-safe: buffers may be taken on one thread and freed on any other."""

    def __init__(self) -> None:
        self._free: dict[int, list[mmap.mmap]] = {}
        self._lock = threading.Lock()
        self.allocated = 0  # buffers that took fresh pages
        self.recycled = 0  # buffers handed out again

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of ``nbytes`` (contents undefined: a recycled buffer holds old bytes)."""
        if nbytes <= 0:
            return np.empty(0, dtype=np.uint8)
        with self._lock:
            free = self._free.get(nbytes)
            region = free.pop() if free else None
            if region is None:
                self.allocated += 1
            else:
                self.recycled += 1
        if region is None:
            region = host_region(nbytes)
        array = np.frombuffer(region, dtype=np.uint8)
        weakref.finalize(array, self._release, nbytes, region).atexit = False
        return array

    def free_buffers(self, nbytes: int) -> int:
        """Buffers of ``nbytes`` waiting to be handed out again."""
        with self._lock:
            return len(self._free.get(nbytes, ()))

    def _release(self, nbytes: int, region: mmap.mmap) -> None:
        """Called when the array handed out (and everything derived from it) has been freed."""
        with self._lock:
            free = self._free.setdefault(nbytes, [])
            if len(free) < max(2, FREE_BYTES_PER_SIZE // nbytes):
                free.append(region)
