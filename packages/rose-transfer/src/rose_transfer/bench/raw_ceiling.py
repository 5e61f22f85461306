"""The raw ceiling of this host's loopback TCP: one stream, ``sendall`` of one big buffer into
``recv_into`` of touched memory, best of three (no framing, signing or checksums)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import numpy as np


def raw_tcp_gbps(data: np.ndarray, runs: int = 3) -> float:
    view = data.reshape(-1).view(np.uint8).data
    target = np.ones(view.nbytes, dtype=np.uint8)
    best = 0.0
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        for _ in range(runs):
            sender = threading.Thread(target=_send_once, args=(server, view), daemon=True)
            sender.start()
            best = max(best, _receive(port, target.data))
            sender.join()
    return best


def _send_once(server: socket.socket, data: memoryview) -> None:
    sock, _ = server.accept()
    with sock:
        sock.sendall(data)


def _receive(port: int, view: memoryview) -> float:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.perf_counter()
        received = 0
        while received < view.nbytes:
            n = sock.recv_into(view[received:])
            if n == 0:
                raise ConnectionError("the raw TCP sender closed early")
            received += n
        return view.nbytes / (time.perf_counter() - started) / 1e9


def raw_ucx_gbps(data: np.ndarray, runs: int = 3) -> float:
    """The same over ucxx: one endpoint sends the whole buffer as one tag message (best of ``runs``)."""
    from rose_transfer.wire.ucx_transport import ucxx_module

    ucxx = ucxx_module()
    source = data.reshape(-1).view(np.uint8)
    target = np.ones(source.nbytes, dtype=np.uint8)

    async def once() -> float:
        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def handler(ep: Any) -> None:  # a ucxx endpoint (ucxx is untyped)
            started = time.perf_counter()
            await ep.recv(target)
            done.set_result(source.nbytes / (time.perf_counter() - started) / 1e9)
            await ep.close()

        listener = ucxx.create_listener(handler, 0)
        ep = await ucxx.create_endpoint("127.0.0.1", listener.port)
        await ep.send(source)
        gbps = await done
        await ep.close()
        listener.close()
        return gbps

    return max(asyncio.run(once()) for _ in range(runs))
