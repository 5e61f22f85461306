"""Large host buffers for weight streams.

Fresh 4 KiB pages cost a page fault each on first touch, which on some hosts (VMs) makes filling a
300 MB buffer take most of a second. Anonymous maps advised for transparent huge pages fault 512x
less often where the kernel has huge pages to give; ``buffer_pool`` recycles buffers so that a
publisher's later versions land in pages already faulted in.
"""

from __future__ import annotations

import mmap

import numpy as np

_HUGE_THRESHOLD = 4 * 1024 * 1024


def host_region(nbytes: int) -> mmap.mmap:
    """An anonymous private map of ``nbytes`` (> 0), advised for transparent huge pages."""
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        region.madvise(advice)
    return region


def host_buffer(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` (contents undefined until written)."""
    if nbytes < _HUGE_THRESHOLD:
        return np.empty(nbytes, dtype=np.uint8)
    return np.frombuffer(host_region(nbytes), dtype=np.uint8)  # the array keeps the map alive
