"""``UpstreamLink``: a relay's pipelined connection to the publisher.

Requests are sent as they come; replies arrive in request order, so each resolves the oldest waiting
future. Replies are verified (signature, message type) and kept as the sealed frames the publisher
sent: the relay forwards them byte for byte, and receivers check them end to end (same secret). A
broken connection fails every waiting request; the next request opens a new connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

import msgspec

from rose_core.protocol.auth import Signer
from rose_core.protocol.messages import Hello, TransferReply, WeightManifest, Welcome
from rose_core.protocol.wire import DEFAULT_MAX_MESSAGE_BYTES, Framer
from rose_transfer._version import __version__
from rose_transfer.errors import TransferError, refuse_unsigned
from rose_transfer.wire.connect import open_connection
from rose_transfer.wire.frame_connection import REPLY_OVERHEAD, FrameConnection

log = logging.getLogger(__name__)


class UpstreamLink:
    def __init__(self, secret: bytes, source: str, relay_id: str, timeout: float = 30.0) -> None:
        self._secret = secret
        self.source = source
        self.relay_id = relay_id
        self._timeout = timeout
        self._conn: FrameConnection | None = None
        self._waiting: deque[asyncio.Future[list[Any]]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()
        self.bytes_received = 0
        self._framer = Framer(Signer(secret), TransferReply)

    async def request(self, msg: msgspec.Struct) -> list[Any]:
        """The publisher's sealed reply frames to ``msg`` (raises OSError/TransferError on failure)."""
        conn = await self._connection()
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        try:
            await conn.send(self._framer.seal(msg))
        except OSError as exc:
            self._fail(exc)
        return await future

    async def _connection(self) -> FrameConnection:
        async with self._connecting:
            if self._conn is None:
                conn = await open_connection(self.source, self._timeout, self._secret)
                self._framer = Framer(Signer(self._secret), TransferReply)  # a session per connection (replays)
                try:
                    await self._handshake(conn)
                except BaseException:
                    conn.close()
                    raise
                self._conn = conn
                self._reader = asyncio.create_task(self._read(conn))
            return self._conn

    async def _handshake(self, conn: FrameConnection) -> None:
        framer = self._framer
        hello = Hello(peer_id=self.relay_id, kind="weights", software=f"rose-transfer {__version__} relay")
        await conn.send(framer.seal(hello))
        reply = framer.open(await conn.recv(DEFAULT_MAX_MESSAGE_BYTES, idle_timeout=self._timeout))
        refuse_unsigned(reply, self.source)
        if not isinstance(reply, Welcome):
            raise TransferError(f"the publisher at {self.source} refused the relay: check the shared secret")

    async def _read(self, conn: FrameConnection) -> None:
        """Verify and hand over replies in order. The size limit grows to a manifest's bucket size (plus
        the reply's framing) when one passes: a dense bucket of the default 64 MiB is larger than the
        default message limit."""
        limit = DEFAULT_MAX_MESSAGE_BYTES
        framer = Framer(Signer(self._secret), TransferReply, limit)
        loop = asyncio.get_running_loop()
        try:
            while True:
                frames = await conn.recv(limit, idle_timeout=self._timeout)
                self.bytes_received += sum(memoryview(f).nbytes for f in frames)
                reply = await loop.run_in_executor(None, framer.open, frames)  # verify before forwarding
                refuse_unsigned(reply, self.source)  # a forged notice breaks the link; never forwarded
                if isinstance(reply, WeightManifest) and reply.bucket_bytes + REPLY_OVERHEAD > limit:
                    limit = reply.bucket_bytes + REPLY_OVERHEAD
                    framer = Framer(Signer(self._secret), TransferReply, limit)
                if self._waiting:
                    future = self._waiting.popleft()
                    if not future.done():
                        future.set_result(frames)
        except Exception as exc:
            log.info("relay link to %s ended: %s", self.source, exc)
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        error = exc if isinstance(exc, OSError) else ConnectionError(f"upstream {self.source}: {exc}")
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)

    async def close(self) -> None:
        self._fail(ConnectionError("relay closed"))
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
