"""``MemorySink``: a pull into ``ResidentWeights``, staged in memory and applied whole by ``commit``.

Dense buckets land in a staging buffer of the version's size (checked against the manifest's
checksum as they arrive); patches are kept as they came (O(changes)) after their structure is
checked. Nothing touches the resident weights before ``commit`` (``resident_commit``)."""

from __future__ import annotations

import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import numpy as np

from rose_core.protocol.auth import Signer
from rose_core.protocol.messages import BucketInfo, TransferReply, WeightManifest
from rose_core.protocol.wire import Framer
from rose_core.support.errors import MissingExtraError
from rose_transfer.codec.bucket_codec import DENSE, CodecError, unpack_payload
from rose_transfer.codec.sparse_patch import PatchError, parse_patch
from rose_transfer.errors import BucketCorrupt, TransferError
from rose_transfer.fetch.bucket_checker import open_bucket_reply
from rose_transfer.fetch.fetch_progress import FetchProgress
from rose_transfer.resident.resident_weights import ResidentWeights
from rose_transfer.version.manifest import bucket_checksum
from rose_transfer.wire.frame_connection import REPLY_OVERHEAD


class MemorySink:
    def __init__(self, secret: bytes, target: ResidentWeights, progress: FetchProgress, window: int) -> None:
        self._secret = secret
        self.target = target
        self._progress = progress
        self.window = window
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rose-stage")
        self.patches: dict[int, np.ndarray] = {}
        self.dense: set[int] = set()
        self.staging: np.ndarray | None = None
        self._local = threading.local()
        self._max = 0
        self._lock = threading.Lock()

    @property
    def pool(self) -> Executor:
        return self._pool

    def prepare(self, manifest: WeightManifest) -> None:
        self._max = manifest.bucket_bytes + REPLY_OVERHEAD
        if self.target.holds(self._progress.have_version, manifest):
            self._progress.base_buckets = self.target.valid

    def landing(self, info: BucketInfo) -> tuple[None, memoryview | None]:
        """Buckets asked dense land in place in the staging buffer; patches wherever they fit."""
        if self._progress.bucket_base(info.index) >= 0:
            return None, None
        return None, self._region(info).data

    def accept(self, frames: list[Any], info: BucketInfo, token: None) -> None:
        reply = open_bucket_reply(self._framer(), frames, self._progress.version, info)
        try:
            kind, payload = unpack_payload(reply.encoding, reply.data, info.nbytes)
        except CodecError as exc:
            raise BucketCorrupt(str(exc)) from None
        except MissingExtraError as exc:
            raise TransferError(str(exc)) from None
        if kind == DENSE:
            self._stage_dense(payload, info)
        else:
            self._stage_patch(payload, info)

    def release(self, token: None) -> None:
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _stage_dense(self, data: np.ndarray, info: BucketInfo) -> None:
        if data.nbytes != info.nbytes or bucket_checksum(data) != info.checksum:
            raise BucketCorrupt("checksum mismatch")
        region = self._region(info)
        if data.ctypes.data != region.ctypes.data:  # it did not land in place (e.g. asked as a patch)
            region[:] = data
        self.patches.pop(info.index, None)
        self.dense.add(info.index)

    def _stage_patch(self, payload: np.ndarray, info: BucketInfo) -> None:
        if self._progress.bucket_base(info.index) < 0:
            raise BucketCorrupt("a patch came for a bucket asked dense")
        try:
            parse_patch(payload, info.nbytes)
        except PatchError as exc:
            raise BucketCorrupt(f"patch is malformed ({exc})") from None
        self.dense.discard(info.index)
        self.patches[info.index] = payload

    def _region(self, info: BucketInfo) -> np.ndarray:
        with self._lock:
            if self.staging is None:
                manifest = self._progress.manifest
                if manifest is None:
                    raise RuntimeError("a memory sink is prepared before it receives buckets")
                self.staging = self.target.staging(manifest.total_bytes)
        return self.staging[info.offset : info.offset + info.nbytes]

    def _framer(self) -> Framer:
        framer = getattr(self._local, "framer", None)
        if framer is None:
            framer = self._local.framer = Framer(Signer(self._secret), TransferReply, self._max)
        return framer
