"""The receiver's side of the weight channel: one authenticated connection to a publisher.

``pull`` keeps up to ``window`` buckets requested-but-unverified (the bound that gives backpressure),
receives each bucket's bytes straight into the place its ``BucketSink`` names, and verifies it on a
worker thread while the next one arrives. Failed buckets go back to the queue; what is verified is
recorded in the ``FetchProgress``, so a new connection resumes with only the missing buckets.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from rose_core.protocol.auth import Signer
from rose_core.protocol.messages import (
    ErrorReport,
    FetchBucket,
    FetchManifest,
    Hello,
    ShardView,
    TransferReply,
    WeightManifest,
    Welcome,
)
from rose_core.protocol.wire import DEFAULT_MAX_MESSAGE_BYTES, Framer
from rose_core.support.errors import ProtocolError
from rose_transfer._version import __version__
from rose_transfer.errors import BucketCorrupt, TransferError, refuse_unsigned
from rose_transfer.fetch.bucket_sink import BucketSink
from rose_transfer.fetch.fetch_progress import FetchProgress
from rose_transfer.metrics import BUCKET_RETRIES
from rose_transfer.wire.connect import open_connection
from rose_transfer.wire.frame_connection import REPLY_OVERHEAD, FrameConnection


class TransferClient:
    def __init__(self, conn: FrameConnection, framer: Framer, source: str, io_timeout: float) -> None:
        self._conn = conn
        self._framer = framer
        self.source = source
        self._timeout = io_timeout

    @classmethod
    async def connect(cls, source: str, *, secret: bytes, receiver_id: str, timeout: float) -> TransferClient:
        """A client connected to ``source`` (``tcp://`` or ``ucx://``) that passed the handshake."""
        conn = await open_connection(source, timeout, secret)
        try:
            client = cls(conn, Framer(Signer(secret), TransferReply), source, timeout)
            await client._handshake(receiver_id)
        except BaseException:
            conn.close()
            raise
        return client

    def close(self) -> None:
        self._conn.close()

    @property
    def bytes_received(self) -> int:
        return self._conn.bytes_received

    async def _request(self, msg: Any) -> Any:
        await self._conn.send(self._framer.seal(msg))
        frames = await self._conn.recv(DEFAULT_MAX_MESSAGE_BYTES, idle_timeout=self._timeout)
        reply = self._framer.open(frames)
        refuse_unsigned(reply, self.source)  # retried like a dropped connection, never acted on
        return reply

    async def _handshake(self, receiver_id: str) -> None:
        hello = Hello(peer_id=receiver_id, kind="weights", software=f"rose-transfer {__version__}")
        try:
            reply = await self._request(hello)
        except ProtocolError as exc:
            raise TransferError(
                f"cannot trust the weight publisher at {self.source} ({exc}): use the controller's shared secret"
            ) from exc
        if isinstance(reply, ErrorReport):
            raise TransferError(f"the weight publisher at {self.source} refused this receiver: {reply.message}")
        if not isinstance(reply, Welcome):
            raise TransferError(f"{self.source} answered hello with {type(reply).__name__}: is it a weight publisher?")

    async def fetch_manifest(
        self, version: int, have_version: int, receiver_id: str, view: ShardView | None = None
    ) -> WeightManifest:
        request = FetchManifest(version=version, have_version=have_version, receiver_id=receiver_id, view=view)
        reply = await self._request(request)
        if isinstance(reply, ErrorReport):
            raise TransferError(f"cannot fetch weight version {version} from {self.source}: {reply.message}")
        if not isinstance(reply, WeightManifest):
            raise TransferError(f"{self.source} answered a manifest request with {type(reply).__name__}")
        return reply

    async def pull(self, progress: FetchProgress, sink: BucketSink, receiver_id: str) -> None:
        """Pull every bucket ``progress`` misses, keeping at most ``sink.window`` requested or being
        verified (each lands where ``sink`` says and is accepted on its worker threads)."""
        manifest = progress.manifest
        if manifest is None:
            raise RuntimeError("pull needs the manifest first")
        loop = asyncio.get_running_loop()
        limit = manifest.bucket_bytes + REPLY_OVERHEAD
        pending = deque(progress.missing())
        requested: deque[int] = deque()
        checks: dict[asyncio.Future[None], tuple[int, Any]] = {}
        try:
            while pending or requested or checks:
                while pending and len(requested) + len(checks) < sink.window:
                    index = pending.popleft()
                    await self._conn.send(self._framer.seal(_bucket_request(progress, index, receiver_id)))
                    requested.append(index)
                if requested:
                    info = manifest.buckets[requested.popleft()]
                    token, region = sink.landing(info)
                    try:
                        frames = await self._conn.recv(limit, bulk_into=region, idle_timeout=self._timeout)
                    except BaseException:
                        sink.release(token)
                        raise
                    checks[loop.run_in_executor(sink.pool, sink.accept, frames, info, token)] = (info.index, token)
                    del frames, region
                await _harvest(progress, sink, checks, pending, block=not requested)
        finally:
            if checks:
                await asyncio.wait(checks)
                await _harvest(progress, sink, checks, pending, block=False)


def _bucket_request(progress: FetchProgress, index: int, receiver_id: str) -> FetchBucket:
    return FetchBucket(
        version=progress.version,
        index=index,
        have_version=progress.bucket_base(index),
        receiver_id=receiver_id,
        view=progress.view,
    )


async def _harvest(
    progress: FetchProgress,
    sink: BucketSink,
    checks: dict[asyncio.Future[None], tuple[int, Any]],
    pending: deque[int],
    *,
    block: bool,
) -> None:
    """Record finished checks: verified buckets are done, corrupt ones go back to ``pending``."""
    if block and checks:
        await asyncio.wait(checks, return_when=asyncio.FIRST_COMPLETED)
    error: BaseException | None = None
    for future in [f for f in checks if f.done()]:
        index, token = checks.pop(future)
        sink.release(token)
        exc = future.exception()
        if exc is None:
            progress.done.add(index)
        elif isinstance(exc, BucketCorrupt):
            BUCKET_RETRIES.inc()
            pending.append(index)
            try:
                progress.corrupt(index, str(exc))
            except TransferError as failed:
                error = error or failed
        else:
            error = error or exc
    if error is not None:
        raise error
