"""A TCP proxy between receivers and a publisher that cuts, stalls or corrupts the publisher's replies (the transfer
fault tests, and the executor's test of a process killed in the middle of a pull).

``cuts[i]`` is where connection ``i`` is cut (bytes of replies forwarded; ``None``: never),
``stalls[i]`` where it stops forwarding without closing, ``flip_at`` flips one bit of the first
connection's replies at that byte.
"""

from __future__ import annotations

import asyncio
import contextlib


class FaultyProxy:
    def __init__(
        self,
        upstream_port: int,
        *,
        cuts: list[int | None] | None = None,
        stalls: list[int | None] | None = None,
        flip_at: int | None = None,
    ) -> None:
        self._upstream_port = upstream_port
        self._cuts = cuts or []
        self._stalls = stalls or []
        self._flip_at = flip_at
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._handlers: set[asyncio.Task[None]] = set()
        self.connections = 0
        self.cut = 0
        self.stalled = 0
        self.flipped = False

    @property
    def source(self) -> str:
        if self._server is None:
            raise RuntimeError("start the proxy first")
        return f"tcp://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> FaultyProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        index = self.connections
        self.connections += 1
        cut = self._cuts[index] if index < len(self._cuts) else None
        stall = self._stalls[index] if index < len(self._stalls) else None
        flip = self._flip_at if index == 0 else None
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        self._writers += [client_writer, up_writer]
        pumps = [
            asyncio.create_task(self._pump(client_reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, client_writer, cut=cut, stall=stall, flip=flip)),
        ]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for writer in (client_writer, up_writer):
            writer.transport.abort()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cut: int | None = None,
        stall: int | None = None,
        flip: int | None = None,
    ) -> None:
        position = 0
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                end = position + len(chunk)
                if flip is not None and position <= flip < end:
                    data = bytearray(chunk)
                    data[flip - position] ^= 0x40
                    chunk, self.flipped = bytes(data), True
                if cut is not None and end >= cut:
                    writer.write(chunk[: cut - position])
                    await writer.drain()
                    self.cut += 1
                    return
                if stall is not None and end >= stall:
                    writer.write(chunk[: stall - position])
                    await writer.drain()
                    self.stalled += 1
                    await asyncio.Event().wait()  # silent until the proxy is closed
                position = end
                writer.write(chunk)
                await writer.drain()
