"""``FrameSocket``: messages from several senders on one connection arrive whole and in one piece."""

from __future__ import annotations

import asyncio
import socket

import numpy as np

from rose_transfer.wire.frame_socket import FrameSocket


def test_concurrent_senders_never_interleave_their_frames() -> None:
    async def run() -> list[list[bytes]]:
        left, right = socket.socketpair()
        sender, receiver = FrameSocket(left), FrameSocket(right)

        async def send(tag: int) -> None:
            for i in range(6):
                big = np.full(3 << 20, tag, dtype=np.uint8)  # large enough that sendall yields
                await sender.send([bytes([tag]), i.to_bytes(2, "big"), big])

        async def receive() -> list[list[bytes]]:
            return [[bytes(f) for f in await receiver.recv(8 << 20)] for _ in range(12)]

        got = await asyncio.gather(receive(), send(1), send(2))
        sender.close()
        receiver.close()
        return got[0]

    messages = asyncio.run(run())
    for tag, _index, big in messages:
        assert len(big) == 3 << 20 and set(big) == {tag[0]}
    for tag in (1, 2):
        assert [int.from_bytes(m[1], "big") for m in messages if m[0][0] == tag] == list(range(6))
