"""Multipart messages over a TCP stream: ``u32 count``, ``count x u64 length``, then the frames.

The frames are the output of ``rose_core.protocol.wire.Framer.seal`` (envelope, HMAC, header, bulk buffers), so
every message on the stream is authenticated; this layer only delimits them. Large frames are sent from
and received into caller memory without copies (``loop.sock_sendall`` / ``loop.sock_recv_into``); a
receiver can name the buffer that the bulk frame of the next message lands in. A ``SendGate``, if
given, admits each piece before it is sent (``send_gate``).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Sequence
from typing import Any

from rose_core.support.errors import ProtocolError
from rose_transfer.wire.send_gate import GATE_CHUNK_BYTES, SendGate

MAX_FRAMES = 16
_COUNT = struct.Struct(">I")
_SMALL = 64 * 1024
_READ_BUFFER = 256 * 1024
_TLS_RECORDS = (0x15, 0x16)
"""First bytes of a TLS alert or handshake record: 21 or 22, then version major 3 (a frame count never is)."""


class ConnectionClosed(ConnectionError):
    """The peer closed the stream (cleanly between messages, or in the middle of one)."""


class FrameSocket:
    """One connected, non-blocking TCP socket driven by the running event loop."""

    def __init__(self, sock: socket.socket, stall_timeout: float = 60.0, gate: SendGate | None = None) -> None:
        sock.setblocking(False)
        self.gate = gate
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            _tune(sock, stall_timeout)
        self.sock = sock
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray(_READ_BUFFER)
        self._start = 0
        self._end = 0
        self.bytes_received = 0
        self.bytes_sent = 0
        self._sending = asyncio.Lock()  # one message's frames go out together, whoever else sends

    def close(self) -> None:
        self.sock.close()

    # ---------------------------------------------------------------- send

    async def send(self, frames: Sequence[Any]) -> None:
        async with self._sending:
            await self._send_message(frames)

    async def _send_message(self, frames: Sequence[Any]) -> None:
        views = [memoryview(f).cast("B") for f in frames]
        prefix = _COUNT.pack(len(views)) + struct.pack(f">{len(views)}Q", *(v.nbytes for v in views))
        pending: list[bytes | memoryview] = [prefix]
        for view in views:
            if view.nbytes >= _SMALL:
                await self._sendall(b"".join(pending))
                pending = []
                await self._sendall(view)
            else:
                pending.append(view)
        if pending:
            await self._sendall(b"".join(pending))

    async def _sendall(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if self.gate is None:
            await self._send_bytes(view)
        else:  # in pieces, each admitted by the gate
            for start in range(0, view.nbytes, GATE_CHUNK_BYTES):
                piece = view[start : start + GATE_CHUNK_BYTES]
                await self.gate.admit(piece.nbytes)
                await self._send_bytes(piece)
        self.bytes_sent += view.nbytes

    async def _send_bytes(self, view: memoryview) -> None:
        """Put ``view`` on the stream (``TlsFrameSocket`` encrypts it first)."""
        await self._loop.sock_sendall(self.sock, view)

    # ---------------------------------------------------------------- receive

    async def recv(
        self, max_bytes: int, bulk_into: memoryview | None = None, idle_timeout: float | None = None
    ) -> list[Any]:
        """The frames of the next message. If it has a fourth (bulk) frame exactly as long as
        ``bulk_into``, that frame is read into ``bulk_into`` and returned as that view.

        ``idle_timeout`` bounds the time without a received byte (not the whole message: a 64 MiB
        bucket on a slow link may take minutes, and that is fine while bytes keep arriving)."""
        if idle_timeout is None:
            return await self._recv(max_bytes, bulk_into)
        task = asyncio.ensure_future(self._recv(max_bytes, bulk_into))
        seen = self.bytes_received
        try:
            while not (await asyncio.wait({task}, timeout=idle_timeout))[0]:
                if self.bytes_received == seen:
                    raise TimeoutError(f"no bytes from the peer for {idle_timeout:g} s")
                seen = self.bytes_received
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return task.result()

    async def _recv(self, max_bytes: int, bulk_into: memoryview | None) -> list[Any]:
        head = await self._read_small(_COUNT.size)
        (count,) = _COUNT.unpack(head)
        if head[0] in _TLS_RECORDS and head[1] == 3:  # a TLS record (alert, handshake): this end is not TLS
            raise ProtocolError("malformed", "the peer speaks TLS: dial it as tls://HOST:PORT")
        if not 0 < count <= MAX_FRAMES:
            raise ProtocolError("malformed", f"message announces {count} frames (at most {MAX_FRAMES})")
        lengths = struct.unpack(f">{count}Q", await self._read_small(8 * count))
        size = sum(lengths)
        if size > max_bytes:
            raise ProtocolError("oversized", f"message of {size} bytes exceeds the limit of {max_bytes}")
        frames: list[Any] = []
        for index, length in enumerate(lengths):
            if index == 3 and bulk_into is not None and bulk_into.nbytes == length:
                target = bulk_into
            else:
                target = memoryview(bytearray(length))
            await self._read_into(target)
            frames.append(target)
        return frames

    async def _read_small(self, n: int) -> bytes:
        target = memoryview(bytearray(n))
        await self._read_into(target)
        return target.tobytes()

    async def _read_into(self, target: memoryview) -> None:
        filled = self._take_buffered(target)
        while filled < target.nbytes:
            rest = target[filled:]
            if rest.nbytes >= _READ_BUFFER:
                filled += await self._recv_into(rest)
            else:
                self._start, self._end = 0, await self._recv_into(memoryview(self._buf))
                filled += self._take_buffered(rest)

    def _take_buffered(self, target: memoryview) -> int:
        n = min(self._end - self._start, target.nbytes)
        if n:
            target[:n] = self._buf[self._start : self._start + n]
            self._start += n
        return n

    async def _recv_into(self, target: memoryview) -> int:
        n = await self._loop.sock_recv_into(self.sock, target)
        if n == 0:
            raise ConnectionClosed("the peer closed the connection")
        self.bytes_received += n
        return n


def _tune(sock: socket.socket, stall_timeout: float) -> None:
    """No Nagle delay; and a peer that stops acknowledging (gone without a reset) fails our sends after
    ``stall_timeout`` instead of holding the connection forever."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
    if user_timeout is not None:
        sock.setsockopt(socket.IPPROTO_TCP, user_timeout, int(stall_timeout * 1000))
