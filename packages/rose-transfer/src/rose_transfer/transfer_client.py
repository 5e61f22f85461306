"""The receiver's side of the weight channel: one authenticated connection to a publisher.

``pull`` keeps up to ``window`` buckets requested-but-unverified (the bound that gives backpressure),
receives each bucket's bytes straight into its place in the destination file, and verifies it on a
worker thread while the next one arrives. Failed buckets go back to the queue; what is verified is
recorded in the ``FetchProgress``, so a new connection resumes with only the missing buckets.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any

import numpy as np

from rose_core.auth import Signer
from rose_core.errors import ProtocolError
from rose_core.messages import (
    ErrorReport,
    FetchBucket,
    FetchManifest,
    Hello,
    TransferReply,
    WeightManifest,
    Welcome,
)
from rose_core.wire import DEFAULT_MAX_MESSAGE_BYTES, Framer
from rose_transfer import __version__
from rose_transfer.bucket_checker import BucketChecker
from rose_transfer.errors import BucketCorrupt, TransferError
from rose_transfer.fetch_progress import FetchProgress
from rose_transfer.frame_connection import FrameConnection
from rose_transfer.frame_socket import FrameSocket
from rose_transfer.metrics import BUCKET_RETRIES

REPLY_OVERHEAD = 1024 * 1024


class TransferClient:
    def __init__(self, conn: FrameConnection, framer: Framer, source: str, io_timeout: float) -> None:
        self._conn = conn
        self._framer = framer
        self.source = source
        self._timeout = io_timeout

    @classmethod
    async def connect(
        cls, host: str, port: int, *, secret: bytes, receiver_id: str, source: str, timeout: float
    ) -> TransferClient:
        if source.startswith("ucx://"):
            from rose_transfer.ucx_transport import ucx_connect

            conn = await ucx_connect(source, timeout)
            try:
                client = cls(conn, Framer(Signer(secret), TransferReply), source, timeout)
                await client._handshake(receiver_id)
            except BaseException:
                conn.close()
                raise
            return client
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
            client = cls(FrameSocket(sock), Framer(Signer(secret), TransferReply), source, timeout)
            await client._handshake(receiver_id)
        except BaseException:
            sock.close()
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
        return self._framer.open(frames)

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

    async def fetch_manifest(self, version: int, have_version: int, receiver_id: str) -> WeightManifest:
        reply = await self._request(FetchManifest(version=version, have_version=have_version, receiver_id=receiver_id))
        if isinstance(reply, ErrorReport):
            raise TransferError(f"cannot fetch weight version {version} from {self.source}: {reply.message}")
        if not isinstance(reply, WeightManifest):
            raise TransferError(f"{self.source} answered a manifest request with {type(reply).__name__}")
        return reply

    async def pull(
        self, progress: FetchProgress, checker: BucketChecker, buffers: list[np.ndarray], receiver_id: str
    ) -> None:
        """Pull every bucket ``progress`` misses, keeping at most ``len(buffers)`` in flight (each lands
        in a free buffer, is verified on a worker thread and written to the file); returns when all are."""
        manifest, file = progress.manifest, progress.file
        if manifest is None or file is None:
            raise RuntimeError("pull needs the manifest and the destination file first")
        loop = asyncio.get_running_loop()
        limit = manifest.bucket_bytes + REPLY_OVERHEAD
        pending = deque(progress.missing())
        free = deque(buffers)
        requested: deque[int] = deque()
        checks: dict[asyncio.Future[None], tuple[int, np.ndarray]] = {}
        try:
            while pending or requested or checks:
                while pending and len(requested) < len(free):
                    index = pending.popleft()
                    request = FetchBucket(
                        version=progress.version,
                        index=index,
                        have_version=progress.bucket_base(index),
                        receiver_id=receiver_id,
                    )
                    await self._conn.send(self._framer.seal(request))
                    requested.append(index)
                if requested:
                    info = manifest.buckets[requested.popleft()]
                    buffer = free.popleft()
                    region = buffer.data[: info.nbytes]
                    frames = await self._conn.recv(limit, bulk_into=region, idle_timeout=self._timeout)
                    base = progress.base if progress.bucket_base(info.index) >= 0 else None
                    future = loop.run_in_executor(
                        checker.pool, checker.check, frames, progress.version, info, buffer[: info.nbytes], base, file
                    )
                    checks[future] = (info.index, buffer)
                    del frames, region
                await _harvest(progress, checks, pending, free, block=not requested)
        finally:
            if checks:
                await asyncio.wait(checks)
                await _harvest(progress, checks, pending, free, block=False)


async def _harvest(
    progress: FetchProgress,
    checks: dict[asyncio.Future[None], tuple[int, np.ndarray]],
    pending: deque[int],
    free: deque[np.ndarray],
    *,
    block: bool,
) -> None:
    """Record finished checks: verified buckets are done, corrupt ones go back to ``pending``."""
    if block and checks:
        await asyncio.wait(checks, return_when=asyncio.FIRST_COMPLETED)
    error: BaseException | None = None
    for future in [f for f in checks if f.done()]:
        index, buffer = checks.pop(future)
        free.append(buffer)
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
