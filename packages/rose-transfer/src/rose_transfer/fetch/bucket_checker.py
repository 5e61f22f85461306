"""Verifies received bucket replies on worker threads (signature and xxhash64), so the event loop keeps
receiving the next bucket meanwhile; hashlib releases the GIL while it hashes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from rose_core.protocol.auth import Signer
from rose_core.protocol.messages import BucketData, BucketInfo, ErrorReport, TransferReply
from rose_core.protocol.wire import Framer, is_unsigned_notice
from rose_core.support.errors import MissingExtraError, ProtocolError
from rose_core.support.metrics import REJECTED_MESSAGES
from rose_transfer.codec.bucket_codec import DENSE, CodecError, decode_bucket
from rose_transfer.errors import BucketCorrupt, TransferError
from rose_transfer.fetch.held_bases import BaseFile
from rose_transfer.fetch.partial_file import PartialFile
from rose_transfer.version.manifest import bucket_checksum


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

    def check(
        self,
        frames: list[Any],
        version: int,
        info: BucketInfo,
        region: np.ndarray,
        base: BaseFile | None,
        file: PartialFile,
    ) -> None:
        """Verify one reply for bucket ``info`` and write the bucket's new bytes into ``file``.

        ``region`` (uint8, the bucket's size) is the buffer the bulk frame may have landed in; a patch
        is applied there to this bucket of ``base`` (the held version). Raises ``BucketCorrupt`` (pull
        it again) or ``TransferError`` (the publisher refused)."""
        reply = open_bucket_reply(self._framer(), frames, version, info)
        data = reply.data if reply.encoding == DENSE else self._decoded(reply, info, region, base)
        if data.nbytes != info.nbytes or bucket_checksum(data) != info.checksum:
            raise BucketCorrupt("checksum mismatch")
        file.write(info.offset, data)

    @staticmethod
    def _decoded(reply: BucketData, info: BucketInfo, region: np.ndarray, base: BaseFile | None) -> np.ndarray:
        if base is None and not reply.encoding.startswith(DENSE):
            raise BucketCorrupt(f"a {reply.encoding!r} bucket came for a bucket asked dense")
        if base is not None:
            base.read_into(info.offset, region)
        try:
            return decode_bucket(reply.encoding, reply.data, region if base is not None else None, out=region)
        except CodecError as exc:
            raise BucketCorrupt(f"patch does not apply ({exc})") from None
        except MissingExtraError as exc:
            raise TransferError(str(exc)) from None


def open_bucket_reply(framer: Framer, frames: list[Any], version: int, info: BucketInfo) -> BucketData:
    """The verified ``BucketData`` answering a request for bucket ``info`` of ``version``."""
    try:
        reply = framer.open(frames)
    except ProtocolError as exc:
        REJECTED_MESSAGES.labels(exc.reason).inc()
        raise BucketCorrupt(f"reply rejected, {exc.reason}") from None
    if is_unsigned_notice(reply):  # anyone can forge one: pull the bucket again
        raise BucketCorrupt(f"an unsigned notice ({reply.code}) in place of bucket {info.index}: not trusted")
    if isinstance(reply, ErrorReport):
        raise TransferError(f"the weight publisher refused bucket {info.index}: {reply.message}")
    if not isinstance(reply, BucketData) or (reply.version, reply.index) != (version, info.index):
        raise BucketCorrupt("reply for another request")
    return reply
