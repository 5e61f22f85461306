"""``ServedView``: a version as one kind of receiver holds it (whole, or one shard view), as the
server reads it: its manifest and its buckets' bytes.

The whole version's buckets are slices of its stream (sent with no copy). A shard view holds no
stream of its own: each bucket is cut from the whole stream when its bytes are needed, into a
scratch buffer for checksums and patches, or into a buffer from the publisher's ``BufferPool`` for
a dense reply (kept with the version's signed frames)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rose_core.protocol.messages import WeightManifest
from rose_transfer.plan.view_cut import ViewCut
from rose_transfer.version.manifest import FlatVersion


@dataclass(slots=True, frozen=True)
class ServedView:
    manifest: WeightManifest
    whole: FlatVersion
    cut: ViewCut | None = None  # None: the whole version

    def bucket(self, index: int, scratch: np.ndarray) -> np.ndarray:
        """Bucket ``index``'s bytes, valid while ``scratch`` (at least one bucket long) is not reused."""
        if self.cut is None:
            return self.whole.bucket(index)
        return self.cut.cut(index, self.whole.stream, scratch)

    def owned_bucket(self, index: int, allocate: Callable[[int], np.ndarray]) -> np.ndarray:
        """Bucket ``index``'s bytes in a buffer nothing else writes (to keep in a signed reply)."""
        if self.cut is None:
            return self.whole.bucket(index)
        return self.cut.cut(index, self.whole.stream, allocate(self.manifest.buckets[index].nbytes))

    def stream(self, allocate: Callable[[int], np.ndarray]) -> np.ndarray:
        """The whole stream as this view holds it (cut into a buffer from ``allocate`` for a view)."""
        if self.cut is None:
            return self.whole.stream
        out = allocate(self.manifest.total_bytes)
        for index, info in enumerate(self.manifest.buckets):
            self.cut.cut(index, self.whole.stream, out[info.offset : info.offset + info.nbytes])
        return out
