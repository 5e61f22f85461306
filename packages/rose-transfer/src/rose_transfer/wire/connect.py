"""Opens a ``FrameConnection`` to a weight source, ``tcp://HOST:PORT``, ``tls://HOST:PORT`` or
``ucx://HOST:PORT``: the one place that dispatches on the scheme (receivers, relays' upstream links and
benchmarks all dial here)."""

from __future__ import annotations

import asyncio
import socket

from rose_core.support.errors import RoseError
from rose_transfer.wire.frame_connection import FrameConnection
from rose_transfer.wire.frame_socket import FrameSocket
from rose_transfer.wire.tcp_address import is_tls, parse_source
from rose_transfer.wire.tls_link import TlsFrameSocket
from rose_transfer.wire.ucx_address import UCX_SCHEME
from rose_transfer.wire.ucx_transport import ucx_connect


async def open_connection(source: str, timeout: float, secret: bytes = b"") -> FrameConnection:
    """A connected ``FrameSocket`` (TCP), ``TlsFrameSocket`` (TLS, its server checked against the key
    ``secret`` derives, within ``timeout``) or ``UcxFrameSocket`` (UCX, the ``[ucx]`` extra) to ``source``;
    ``timeout`` bounds the connect. A malformed source raises ``RoseError`` naming the fix."""
    if source.startswith(UCX_SCHEME):
        return await ucx_connect(source, timeout)
    if is_tls(source):
        if not secret:
            raise RoseError(f"{source} is a TLS weight source: dial it with the shared secret (it pins the server)")
        sock = await _tcp_socket(source, timeout)
        conn = TlsFrameSocket.client(sock, secret)
        try:
            await asyncio.wait_for(conn.handshake(), timeout)
        except BaseException:
            conn.close()
            raise
        return conn
    return FrameSocket(await _tcp_socket(source, timeout))


async def tcp_connect(source: str, timeout: float) -> FrameSocket:
    return FrameSocket(await _tcp_socket(source, timeout))


async def _tcp_socket(source: str, timeout: float) -> socket.socket:
    host, port = parse_source(source)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
        return sock
    except BaseException:
        sock.close()
        raise
