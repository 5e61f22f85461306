"""The executor's loop-owned DEALER (``LoopControlClient``) over real sockets, against a real ``ControlServer``:
messages both ways, the checks on what arrives, a lost controller, encryption, and bursts past its drain batch."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
import zmq
from control_frames import BAD_FRAMES, OTHER, SECRET, hello, rejected, sealed

from rose_core.protocol import messages as m
from rose_core.protocol.auth import observer_key
from rose_core.protocol.messages import FromController
from rose_core.protocol.serde import Encoder
from rose_core.support.errors import RoseError
from rose_core.support.metrics import free_port
from rose_core.transport.channel import ControlServer
from rose_core.transport.loop_control_client import LoopControlClient
from rose_core.transport.zmq_endpoint import DRAIN_BATCH, SEND_HWM


class Received:
    """What a client's ``on_message`` got, and on which thread."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[FromController] = asyncio.Queue()
        self.threads: set[int] = set()

    def __call__(self, peer: bytes, msg: FromController) -> None:
        assert peer == b"controller"
        self.threads.add(threading.get_ident())
        self.queue.put_nowait(msg)

    async def next(self, timeout: float = 10) -> FromController:
        return await asyncio.wait_for(self.queue.get(), timeout)


@pytest.fixture
async def received() -> AsyncIterator[Received]:
    yield Received()


async def server_recv(server: ControlServer, timeout: float = 10) -> tuple[bytes, m.ToController] | None:
    return await asyncio.to_thread(server.recv, timeout)


async def test_messages_flow_both_ways_and_arrive_on_the_loop(server: ControlServer, received: Received) -> None:
    with LoopControlClient(server.address, SECRET, "exec-1", on_message=received) as client:
        client.send(hello("exec-1"))
        assert await server_recv(server) == (b"exec-1", hello("exec-1"))
        tokens = np.arange(5000, dtype=np.int32)
        server.send(b"exec-1", m.TurnRequest(turn_id="t", trajectory_id="x", attempt=0, prompt_token_ids=tokens,
                                             sampling=m.SamplingParams(), min_version=0, max_version=0))
        got = await received.next()
        assert isinstance(got, m.TurnRequest)
        np.testing.assert_array_equal(got.prompt_token_ids, tokens)
    assert received.threads == {threading.get_ident()}  # opened and delivered on the loop's own thread


async def test_a_burst_past_the_drain_batch_arrives_whole_while_the_client_sends(
        server: ControlServer, received: Received) -> None:
    """ZMQ's descriptor fires on edges: more than one drain batch waiting at once (the loop was busy), and what
    arrives while the loop sends (a send can take it in without a new edge), must all be opened."""
    count = DRAIN_BATCH * 2 + 17
    with LoopControlClient(server.address, SECRET, "exec-1", on_message=received) as client:
        client.send(hello("exec-1"))
        assert await server_recv(server) is not None
        for i in range(count):
            server.send(b"exec-1", m.ErrorReport(code="ping", message=str(i)))
        time.sleep(1)  # the loop is busy: the whole burst waits in the socket
        got = [await received.next() for _ in range(count)]  # and no send of ours makes a new edge
        for i in range(count):
            server.send(b"exec-1", m.ErrorReport(code="ping", message=str(count + i)))
        for i in range(count):
            if i % 100 == 0:
                client.send(hello("exec-1"))
            got.append(await received.next())
        assert [g.message for g in got if isinstance(g, m.ErrorReport)] == [str(i) for i in range(2 * count)]


async def test_a_controller_with_another_secret_is_rejected_and_told(received: Received) -> None:
    """What a controller signed with another secret sends is rejected, counted, and answered with one notice;
    the client goes on taking the real controller's messages."""
    with ControlServer("tcp://127.0.0.1:0", OTHER) as impostor, \
            LoopControlClient(impostor.address, SECRET, "exec-1", on_message=received) as client:
        before = rejected("unauthenticated")
        client.send(hello("exec-1"))  # the impostor rejects it, and tells us: that notice is shown, not acted on
        notice = await received.next()
        assert isinstance(notice, m.ErrorReport) and notice.code == "unauthenticated"
        impostor.send(b"exec-1", m.Welcome(controller_id="impostor"))
        await wait_for(lambda: rejected("unauthenticated") > before + 1)  # its own hello, then our rejection
        assert client.rejected == 1
        assert received.queue.empty()


@pytest.mark.parametrize(("frames", "reason"), BAD_FRAMES[:3])
async def test_bad_frames_from_the_controller_are_rejected_and_the_client_keeps_working(
        frames: list[bytes], reason: str, received: Received) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        with LoopControlClient(f"tcp://127.0.0.1:{port}", SECRET, "exec-1", on_message=received) as client:
            client.send(hello("exec-1"))
            peer, *_ = await asyncio.to_thread(router.recv_multipart)
            before = rejected(reason)
            router.send_multipart([peer, *frames])
            router.send_multipart([peer, *sealed(Encoder().encode(m.Welcome(controller_id="c"))[0])])
            assert await received.next() == m.Welcome(controller_id="c")
            assert rejected(reason) == before + 1 and client.rejected == 1
    finally:
        router.close(0)
        ctx.term()


async def test_a_lost_controller_never_blocks_the_loop_and_drops_what_does_not_fit() -> None:
    """No controller: the socket queues up to its high-water mark, the rest is dropped and counted, and every
    send returns at once (the loop keeps running); close returns within its flush time."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    client = LoopControlClient(f"tcp://127.0.0.1:{free_port()}", SECRET, "alone")
    for i in range(3000):
        client.send(hello("alone"))
        if i % 100 == 0:
            await asyncio.sleep(0)
    assert client.dropped >= 3000 - SEND_HWM - 1
    started = time.monotonic()
    client.close(flush_s=0.2)
    assert time.monotonic() - started < 5  # bounded by the flush time, not by the lost controller
    ticker.cancel()
    assert ticks >= 30
    client.send(hello("alone"))  # after close: ignored, not an error


async def test_what_was_sent_before_close_reaches_the_controller(server: ControlServer) -> None:
    client = LoopControlClient(server.address, SECRET, "exec-1")
    for i in range(50):
        client.send(m.Goodbye(peer_id="exec-1", reason=str(i)))
    client.close(flush_s=2)
    got = [await server_recv(server) for _ in range(50)]
    assert [g[1].reason for g in got if g is not None and isinstance(g[1], m.Goodbye)] == [str(i) for i in range(50)]


async def test_an_encrypting_controller_is_reached_with_the_observer_key_and_not_without(received: Received) -> None:
    with ControlServer("tcp://127.0.0.1:0", SECRET, encrypt=True) as server:
        with LoopControlClient(server.address, SECRET, "exec", on_message=received,
                               encrypt_with=observer_key(SECRET)) as client:
            client.send(hello("exec"))
            assert await server_recv(server) == (b"exec", hello("exec"))
            server.send(b"exec", m.Welcome(controller_id="c"))
            assert await received.next() == m.Welcome(controller_id="c")
        with LoopControlClient(server.address, SECRET, "plain") as plain:
            plain.send(hello("plain"))
            assert await server_recv(server, 1) is None  # its connection never completes


async def test_a_bad_address_is_one_clear_error() -> None:
    with pytest.raises(RoseError, match=r"bad controller address .*use tcp://HOST:PORT"):
        LoopControlClient("nowhere:1", SECRET, "exec")


async def wait_for(condition: object, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_the_client_knows_how_long_its_link_to_the_controller_has_been_down() -> None:
    """What a serving host's lease expiry reads: up once the handshake is done, down from the moment a
    controller that died dropped the connection, up again when one listens there again."""
    server = ControlServer("tcp://127.0.0.1:0", SECRET)
    client = LoopControlClient(server.address, SECRET, "e1")
    restarted = None
    try:
        while client.down_for(time.monotonic()) > 0:  # connecting
            await asyncio.sleep(0.01)
        server.close()
        while client.down_for(time.monotonic()) == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert 0.3 <= client.down_for(time.monotonic()) < 30
        restarted = ControlServer(server.address, SECRET)
        while client.down_for(time.monotonic()) > 0:
            await asyncio.sleep(0.01)
    finally:
        client.close()
        for srv in (server, restarted):
            if srv is not None:
                srv.close()
    nowhere = LoopControlClient(f"tcp://127.0.0.1:{free_port()}", SECRET, "e2")
    try:
        await asyncio.sleep(0.2)
        assert nowhere.down_for(time.monotonic()) >= 0.2  # never up: down since it started
    finally:
        nowhere.close()


async def test_a_frame_from_the_controller_says_the_link_is_up_whatever_the_monitor_missed() -> None:
    """A serving host's lease ended 18 s into a lease whose controller answered all along: the monitor never
    saw the handshake (it was attached after the connection; now before). Whatever it misses, a frame that
    arrives from the controller says the link is up."""
    server = ControlServer("tcp://127.0.0.1:0", SECRET)
    got: list[object] = []
    client = LoopControlClient(server.address, SECRET, "e1", on_message=lambda _peer, msg: got.append(msg))
    try:
        client.send(m.Hello(peer_id="e1", kind="executor"))
        peer = None
        while peer is None:
            peer = server.recv(0.05)
            await asyncio.sleep(0)
        client._down_since = time.monotonic() - 100  # as if the monitor had missed the handshake
        server.send(peer[0], m.Welcome(controller_id="c", heartbeat_interval_s=1.0))
        while not got:
            await asyncio.sleep(0.01)
        assert client.down_for(time.monotonic()) == 0
    finally:
        client.close()
        server.close()
