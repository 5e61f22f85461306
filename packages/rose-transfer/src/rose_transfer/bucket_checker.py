"""Verifies received bucket replies on worker threads (HMAC and xxhash64), so the event loop keeps
receiving the next bucket meanwhile; hashlib releases the GIL while it hashes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from rose_core.auth import Signer
from rose_core.errors import ProtocolError
from rose_core.messages import BucketData, BucketInfo, ErrorReport, TransferReply
from rose_core.metrics import REJECTED_MESSAGES
from rose_core.wire import Framer
from rose_transfer.errors import BucketCorrupt, TransferError
from rose_transfer.manifest import bucket_checksum


class BucketChecker:
    def __init__(self, secret: bytes, max_message_bytes: int, workers: int = 2) -> None:
        self._secret = secret
        self._max = max_message_bytes
        self._local = threading.local()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rose-check")

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _framer(self) -> Framer:
        framer = getattr(self._local, "framer", None)
        if framer is None:
            framer = self._local.framer = Framer(Signer(self._secret), TransferReply, self._max)
        return framer

    def check(self, frames: list[Any], version: int, info: BucketInfo, region: memoryview) -> None:
        """Verify one reply for bucket ``info`` and leave its bytes in ``region``.

        Raises ``BucketCorrupt`` (pull it again) or ``TransferError`` (the publisher refused)."""
        try:
            reply = self._framer().open(frames)
        except ProtocolError as exc:
            REJECTED_MESSAGES.labels(exc.reason).inc()
            raise BucketCorrupt(f"reply rejected, {exc.reason}") from None
        if isinstance(reply, ErrorReport):
            raise TransferError(f"the weight publisher refused bucket {info.index}: {reply.message}")
        if not isinstance(reply, BucketData) or (reply.version, reply.index) != (version, info.index):
            raise BucketCorrupt("reply for another request")
        if reply.encoding != "dense":
            raise TransferError(
                f"the publisher sent a {reply.encoding!r} bucket: install the same rose-transfer version on both ends"
            )
        data = reply.data
        if data.nbytes != info.nbytes or bucket_checksum(data) != info.checksum:
            raise BucketCorrupt("checksum mismatch")
        if not (len(frames) == 4 and frames[3] is region):  # small buckets travel inline in the header
            np.frombuffer(region, dtype=np.uint8)[:] = data.reshape(-1).view(np.uint8)
