"""The weight channel over UCX (``ucxx``): the same multipart messages as ``frame_socket`` over TCP.

``UcxFrameSocket`` has ``FrameSocket``'s interface (``send``/``recv``/``close``, byte counters, an
optional ``SendGate``), so ``TransferServer``, ``TransferClient`` and relays run unchanged on it.
A message is a fixed header (frame count and lengths, ``1 + MAX_FRAMES`` u64) and then each frame;
frames over ``UCX_CHUNK_BYTES`` (16 MiB) travel as consecutive chunks (UCX tag messages are received into buffers
of exactly their size; a gate admits each chunk). UCX picks the transport (RDMA, NVLink, shared
memory, TCP) by itself; sources are ``ucx://HOST:PORT``. Needs the ``[ucx]`` extra.

The rule that keeps memory safe: UCX reads and writes an operation's buffer from its own progress thread until
the request completes, and ucxx keeps no reference to the buffer. So an operation given up before its request
completed (a timeout, a task cancelled, a relay or publisher closing) aborts the endpoint while its frame still
holds the buffer: ``abort`` cancels the endpoint's in-flight requests and closes it before it returns, and only
then may the buffer (often the caller's landing region, reused at once) go. A socket given up on is closed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from rose_core.support.errors import ProtocolError, require_extra
from rose_transfer.wire.frame_socket import MAX_FRAMES, ConnectionClosed
from rose_transfer.wire.send_gate import SendGate
from rose_transfer.wire.ucx_address import UCX_SCHEME, parse_ucx_source

log = logging.getLogger(__name__)
_HEADER_WORDS = 1 + MAX_FRAMES
UCX_CHUNK_BYTES = 16 * 1024 * 1024  # one tag message per 16 MiB (per-message costs dominate below)


def ucxx_module() -> Any:
    with require_extra("ucxx (the UCX weight transport)", "rose-transfer[ucx]"):
        import ucxx
    return ucxx


class UcxFrameSocket:
    def __init__(self, endpoint: Any, gate: SendGate | None = None) -> None:
        self._ep = endpoint
        self.gate = gate
        self.bytes_received = 0
        self.bytes_sent = 0
        self._sending = asyncio.Lock()  # one message's pieces go out together, whoever else sends

    def close(self) -> None:
        """Abort the endpoint: its in-flight requests are cancelled before this returns (idempotent; also
        for an endpoint its peer already broke, whose requests ucxx would otherwise cancel later)."""
        self._ep.abort()

    async def send(self, frames: Sequence[Any]) -> None:
        async with self._sending:
            await self._send_message(frames)

    async def _send_message(self, frames: Sequence[Any]) -> None:
        views = [memoryview(f).cast("B") for f in frames]
        if not 0 < len(views) <= MAX_FRAMES:
            raise ValueError(f"a message has 1 to {MAX_FRAMES} frames, not {len(views)}")
        header = np.zeros(_HEADER_WORDS, dtype=np.uint64)
        header[0] = len(views)
        header[1 : 1 + len(views)] = [v.nbytes for v in views]
        await self._send(header.view(np.uint8).data)
        for view in views:
            for start in range(0, view.nbytes, UCX_CHUNK_BYTES):
                piece = view[start : start + UCX_CHUNK_BYTES]
                if self.gate is not None:
                    await self.gate.admit(piece.nbytes)
                await self._send(piece)

    async def _send(self, view: memoryview) -> None:
        array = np.frombuffer(view, dtype=np.uint8)
        try:
            await self._ep.send(array)
        except BaseException as exc:
            self.close()  # while ``array`` is still held: see the module's rule
            if isinstance(exc, Exception):  # ucxx raises its own types for a closed peer
                raise ConnectionClosed(f"UCX send failed: {exc}") from exc
            raise
        self.bytes_sent += view.nbytes

    async def recv(
        self, max_bytes: int, bulk_into: memoryview | None = None, idle_timeout: float | None = None
    ) -> list[Any]:
        """The frames of the next message (the fourth into ``bulk_into`` when its size matches);
        ``idle_timeout`` bounds the wait for each chunk."""
        header = np.empty(_HEADER_WORDS, dtype=np.uint64)
        await self._recv(header.view(np.uint8).data, idle_timeout)
        count = int(header[0])
        if not 0 < count <= MAX_FRAMES:
            raise ProtocolError("malformed", f"message announces {count} frames (at most {MAX_FRAMES})")
        lengths = [int(n) for n in header[1 : 1 + count]]
        if sum(lengths) > max_bytes:
            raise ProtocolError("oversized", f"message of {sum(lengths)} bytes exceeds the limit of {max_bytes}")
        frames: list[Any] = []
        for index, length in enumerate(lengths):
            use_bulk = index == 3 and bulk_into is not None and bulk_into.nbytes == length
            target = bulk_into if use_bulk and bulk_into is not None else memoryview(bytearray(length))
            for start in range(0, length, UCX_CHUNK_BYTES):
                await self._recv(target[start : start + UCX_CHUNK_BYTES], idle_timeout)
            frames.append(target)
        return frames

    async def _recv(self, view: memoryview, idle_timeout: float | None) -> None:
        array = np.frombuffer(view, dtype=np.uint8)
        try:
            await asyncio.wait_for(self._ep.recv(array), idle_timeout)
        except BaseException as exc:
            self.close()  # while ``array`` is still held: a receive given up on must not land later
            if isinstance(exc, Exception) and not isinstance(exc, TimeoutError):
                raise ConnectionClosed(f"UCX receive failed: {exc}") from exc
            raise
        self.bytes_received += view.nbytes


async def ucx_connect(source: str, timeout: float) -> UcxFrameSocket:
    """A connected ``UcxFrameSocket`` to ``source``. A failed connect raises ``TimeoutError`` or
    ``ConnectionError`` (both OSError, as a TCP connect's failures are), never ucxx's own exception types
    (``UCXXNotConnectedError``, ``UCXXCanceledError``, ...: plain Exceptions): callers such as the
    fetcher's fallback from a dead relay to the source handle transport failures as OSError."""
    host, port = parse_ucx_source(source)
    ucxx = ucxx_module()
    fix = "check that a publisher or relay serves UCX at that address (or give its tcp:// source)"
    try:
        endpoint = await asyncio.wait_for(ucxx.create_endpoint(host, port), timeout)
    except TimeoutError as exc:  # ours or ucxx's own connect timeout (5 s per handshake step)
        raise TimeoutError(f"no UCX connection to {source} (timed out): {fix}") from exc
    except Exception as exc:  # ucxx raises its own types for a dead, closed or unresolvable peer
        raise ConnectionError(f"cannot connect to {source} over UCX ({type(exc).__name__}: {exc}): {fix}") from exc
    return UcxFrameSocket(endpoint)


def ucx_listen(
    handle: Callable[[UcxFrameSocket, str], Awaitable[None]],
    host: str = "127.0.0.1",
    port: int = 0,
    gate: SendGate | None = None,
) -> tuple[Any, str]:
    """Start a UCX listener (on the running loop) that hands each connection to ``handle`` (its sends
    admitted by ``gate`` if given); returns the listener (``close()`` it) and its ``ucx://HOST:PORT`` source."""
    ucxx = ucxx_module()

    async def on_connect(endpoint: Any) -> None:
        conn = UcxFrameSocket(endpoint, gate)
        try:
            await handle(conn, "ucx-peer")
        finally:
            conn.close()

    listener = ucxx.create_listener(on_connect, port)
    return listener, f"{UCX_SCHEME}{host}:{listener.port}"
