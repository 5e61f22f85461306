"""Opens a ``FrameConnection`` to a weight source, ``tcp://HOST:PORT`` or ``ucx://HOST:PORT``: the one
place that dispatches on the scheme (receivers, relays' upstream links and benchmarks all dial here)."""

from __future__ import annotations

import asyncio
import socket

from rose_transfer.wire.frame_connection import FrameConnection
from rose_transfer.wire.frame_socket import FrameSocket
from rose_transfer.wire.tcp_address import parse_source
from rose_transfer.wire.ucx_address import UCX_SCHEME
from rose_transfer.wire.ucx_transport import ucx_connect


async def open_connection(source: str, timeout: float) -> FrameConnection:
    """A connected ``FrameSocket`` (TCP) or ``UcxFrameSocket`` (UCX, the ``[ucx]`` extra) to ``source``;
    ``timeout`` bounds the connect. A malformed source raises ``RoseError`` naming the fix."""
    if source.startswith(UCX_SCHEME):
        return await ucx_connect(source, timeout)
    return await tcp_connect(source, timeout)


async def tcp_connect(source: str, timeout: float) -> FrameSocket:
    host, port = parse_source(source)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
        return FrameSocket(sock)
    except BaseException:
        sock.close()
        raise
