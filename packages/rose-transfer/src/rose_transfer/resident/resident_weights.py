"""``ResidentWeights``: a weight version held in memory, updated in place by ``WeightFetcher.fetch_into``.

The version's flat stream (the publisher's layout, ``manifest.tensors`` locate each tensor) lives in
one uint8 buffer; ``arrays()`` are numpy views of its tensors and ``version.torch_tensors.bind_module`` makes a
module's parameters views of it, so a new version lands in the model without a copy. A version is
applied whole or not at all, under ``lock``: readers that must never see a mix hold it (or pause)."""

from __future__ import annotations

import threading

import msgspec
import numpy as np

from rose_core.protocol.messages import WeightManifest
from rose_transfer.resident.undo_log import UndoLog
from rose_transfer.version.host_buffer import host_buffer
from rose_transfer.version.manifest import bucket_checksum, manifest_digest, tensor_views


class ResidentWeights:
    def __init__(self) -> None:
        self.version = -1
        self.manifest: WeightManifest | None = None
        self.stream = np.empty(0, dtype=np.uint8)
        self.valid: frozenset[int] = frozenset()  # buckets holding bytes of ``version``
        self.lock = threading.Lock()
        self.pinned = False  # views were handed out (a bound module): the buffer is never swapped
        self._spare: np.ndarray | None = None
        self.undo = UndoLog()  # reused by every version applied in place (its pages stay warm)

    def holds(self, version: int, manifest: WeightManifest) -> bool:
        """Whether this holds ``version`` in the bucket layout of ``manifest`` (a base for patches)."""
        held = self.manifest
        return (
            version >= 0
            and version == self.version
            and held is not None
            and held.total_bytes == manifest.total_bytes
            and held.view == manifest.view
            and [(b.offset, b.nbytes) for b in held.buckets] == [(b.offset, b.nbytes) for b in manifest.buckets]
        )

    def digest(self) -> str:
        """The manifest digest of what the stream holds now, every bucket re-hashed (reads it all once):
        equal to the held version's ``manifest.digest`` exactly when the bytes are that version's."""
        if self.manifest is None:
            return ""
        stream = self.stream
        buckets = [
            msgspec.structs.replace(b, checksum=bucket_checksum(stream[b.offset : b.offset + b.nbytes]))
            for b in self.manifest.buckets
        ]
        return manifest_digest(msgspec.structs.replace(self.manifest, buckets=buckets))

    def arrays(self) -> dict[str, np.ndarray]:
        """Each tensor as a view of the resident stream (bfloat16 as int16 bits)."""
        return {} if self.manifest is None else tensor_views(self.stream, self.manifest.tensors)

    def staging(self, nbytes: int) -> np.ndarray:
        """A buffer of ``nbytes`` to receive dense buckets into: the one swapped out last time, if it fits."""
        spare, self._spare = self._spare, None
        return spare if spare is not None and spare.nbytes == nbytes else host_buffer(nbytes)

    def swap_in(self, stream: np.ndarray) -> None:
        """Make ``stream`` the resident buffer (a full sync of an unpinned target); keep the old one spare."""
        old, self.stream = self.stream, stream
        self._spare = old if old.nbytes == stream.nbytes else None

    def keep_spare(self, buffer: np.ndarray) -> None:
        """Keep ``buffer`` to receive the next full sync into (no fresh pages then)."""
        self._spare = buffer if buffer is not self.stream else None

    def reserve(self, nbytes: int) -> None:
        """Allocate and touch the resident buffer and its spare now (page faults now, not while a
        version arrives); for a receiver that will take full syncs of ``nbytes``."""
        if self.stream.nbytes != nbytes:
            self.stream = _touched(nbytes)
        if self._spare is None or self._spare.nbytes != nbytes:
            self._spare = _touched(nbytes)

    def forget(self) -> None:
        """Hold no version any more (the memory stays): the next fetch is a full sync."""
        self.version, self.valid = -1, frozenset()

    def set_version(self, manifest: WeightManifest, valid: frozenset[int]) -> None:
        self.version, self.manifest, self.valid = manifest.version, manifest, valid


def _touched(nbytes: int) -> np.ndarray:
    buffer = host_buffer(nbytes)
    buffer[::4096] = 0
    return buffer
