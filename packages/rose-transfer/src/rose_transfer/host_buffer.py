"""Large host buffers for weight streams.

Fresh 4 KiB pages cost a page fault each on first touch: filling a fresh 300 MB buffer took 0.16 s on
this project's VMs. Mapping it with ``MAP_POPULATE`` has the kernel fault the pages in at once
(0.10 s, then 0.01 s to fill). Transparent huge pages were tried: 0.06 s when free huge pages are at
hand, but 0.7 s when the kernel must compact memory first (``defrag=madvise``), so they are not asked for.
"""

from __future__ import annotations

import mmap

import numpy as np

_MAPPED_THRESHOLD = 4 * 1024 * 1024


def host_buffer(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` (contents undefined until written), its pages mapped in."""
    if nbytes < _MAPPED_THRESHOLD:
        return np.empty(nbytes, dtype=np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    region = mmap.mmap(-1, nbytes, flags=flags)
    return np.frombuffer(region, dtype=np.uint8)  # the array keeps the map alive
