"""The authenticated ZMQ channel over real sockets: happy path and every rejection reason."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import zmq
from control_frames import (
    BAD_FRAMES,
    GARBAGE,
    OTHER,
    SECRET,
    hello,
    observer_only_messages,
    rejected,
    sealed,
    sealed_hello,
)
from hypothesis import given, settings

from rose_core.protocol import messages as m
from rose_core.protocol.auth import Signer, executor_key, observer_key
from rose_core.protocol.serde import Encoder
from rose_core.protocol.wire import MAGIC, MAX_NOTICE_BYTES, UNSIGNED_NOTICE, Framer, Stamp, envelope
from rose_core.support.errors import RoseError
from rose_core.support.metrics import DROPPED_MESSAGES, free_port
from rose_core.transport.channel import ControlClient, ControlServer
from rose_core.transport.inbound import NOTICES_PER_S
from rose_core.transport.zmq_endpoint import SEND_HWM


@pytest.fixture
def raw(server: ControlServer) -> Iterator[zmq.Socket[bytes]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    yield sock
    sock.close(0)
    ctx.term()


def test_messages_flow_both_ways_with_bulk_frames(server: ControlServer) -> None:
    with ControlClient(server.address, SECRET, "exec-1") as client:
        client.send(hello("exec-1"))
        peer, msg = server.recv(5)
        assert peer == b"exec-1" and msg == hello("exec-1")
        tokens = np.arange(5000, dtype=np.int32)
        server.send(peer, m.TurnRequest(turn_id="t", trajectory_id="x", attempt=0, prompt_token_ids=tokens,
                                        sampling=m.SamplingParams(), min_version=0, max_version=0))
        got = client.recv(5)
        assert got is not None
        np.testing.assert_array_equal(got[1].prompt_token_ids, tokens)


def test_wrong_secret_is_rejected_counted_and_told(server: ControlServer) -> None:
    before = rejected("unauthenticated")
    with ControlClient(server.address, OTHER, "intruder") as bad, ControlClient(server.address, SECRET, "good") as good:
        bad.send(hello("intruder"))
        notice = bad.recv(5)
        assert notice is not None
        assert isinstance(notice[1], m.ErrorReport) and notice[1].code == "unauthenticated"
        assert "secret" in notice[1].message
        good.send(hello("good"))
        peer, _msg = server.recv(5)
        assert peer == b"good"
    assert rejected("unauthenticated") == before + 1
    assert server.recv(0.2) is None


def test_a_dashboard_credential_is_refused_for_every_non_observer_message(server: ControlServer) -> None:
    """A peer holding only the observer key (what `rose run` hands a dashboard) may say Hello as an observer,
    hear the controller (sealed with its key) and say Goodbye; every executor message it signs is refused
    and counted, and nothing else it sends reaches the controller."""
    before, refused_before = rejected("wrong_role"), server.rejected
    with ControlClient(server.address, observer_key(SECRET), "tui-1") as dashboard:
        for msg in observer_only_messages("tui-1"):
            dashboard.send(msg)
        dashboard.send(m.Hello(peer_id="tui-1", kind="observer"))
        peer, msg = server.recv(5)  # the observer's Hello, and nothing sent before it
        assert (peer, msg) == (b"tui-1", m.Hello(peer_id="tui-1", kind="observer"))
        server.send(peer, m.Welcome(controller_id="c", heartbeat_interval_s=1.0, stall_timeout_s=2.0))
        got = dashboard.recv(5)  # verified with the observer key: the reply was sealed with it
        assert got is not None and isinstance(got[1], m.Welcome)
        dashboard.send(m.Goodbye(peer_id="tui-1", reason="bye"))
        assert server.recv(5) == (b"tui-1", m.Goodbye(peer_id="tui-1", reason="bye"))
    assert server.rejected - refused_before == len(observer_only_messages("tui-1"))
    assert rejected("wrong_role") - before == len(observer_only_messages("tui-1"))


def test_an_executor_key_speaks_only_as_its_executor(server: ControlServer) -> None:
    """A peer holding executor exec-a's own key (what `rose run` hands each executor instead of the secret): on
    its own connection, every executor message naming exec-a is accepted and the controller's replies are
    sealed with that key; a message naming another executor is refused as ``not_owner``; on a connection with
    another executor's routing id the key does not authenticate at all, and an observer's Hello is refused."""
    key = executor_key(SECRET, "exec-a")
    not_owner, unauthenticated = rejected("not_owner"), rejected("unauthenticated")
    with ControlClient(server.address, key, "exec-a") as own, ControlClient(server.address, key, "exec-b") as posing:
        posing.send(m.Hello(peer_id="exec-b", kind="executor"))
        for msg in [m.Hello(peer_id="exec-a", kind="observer"), *observer_only_messages("exec-b")]:
            own.send(msg)
        its_own = [*observer_only_messages("exec-a"), m.ErrorReport(code="lent", message="lent to another job")]
        for msg in its_own:
            own.send(msg)
        accepted = [server.recv(5) for _ in its_own]
        assert [(peer, type(msg)) for peer, msg in accepted] == [  # type: ignore[misc]
            (b"exec-a", type(msg)) for msg in its_own]
        server.send(b"exec-a", m.Welcome(controller_id="c", heartbeat_interval_s=1.0, stall_timeout_s=2.0))
        got = own.recv(5)  # verified with exec-a's key: the reply was sealed with it
        assert got is not None and isinstance(got[1], m.Welcome)
        assert server.recv(0.3) is None
    assert rejected("not_owner") - not_owner == 1 + len(observer_only_messages("exec-b"))
    assert rejected("unauthenticated") - unauthenticated == 1


def test_wrong_version_is_rejected_with_the_fix(server: ControlServer, raw: zmq.Socket[bytes]) -> None:
    before = rejected("wrong_version")
    header = Encoder().encode(hello())[0]
    raw.send_multipart(sealed(header, version=99))
    assert raw.poll(5000)
    notice = Framer(Signer(SECRET), m.FromController).open(raw.recv_multipart())
    assert notice.code == "wrong_version" and "protocol 99" in notice.message
    assert rejected("wrong_version") == before + 1


@pytest.mark.parametrize(("frames", "reason"), BAD_FRAMES)
def test_bad_frames_are_rejected_and_the_server_keeps_working(
    server: ControlServer, raw: zmq.Socket[bytes], frames: list[bytes], reason: str
) -> None:
    before = rejected(reason)
    raw.send_multipart(frames)
    raw.send_multipart(sealed_hello("after"))
    got = server.recv(5)
    assert got is not None and got[1] == hello("after")
    assert rejected(reason) == before + 1


def test_oversized_messages_are_rejected() -> None:
    """Frames of one message that are each under the limit but together over it: opened, counted, dropped."""
    with ControlServer("tcp://127.0.0.1:0", SECRET, max_message_bytes=10_000) as srv:
        before = rejected("oversized")
        with ControlClient(srv.address, SECRET, "big") as client:
            client.send(m.TurnResult(turn_id="t", trajectory_id="x", attempt=0, executor_id="big", weight_version=0,
                                     output_token_ids=np.arange(1500, dtype=np.int32),  # 6,000 bytes per frame
                                     output_logprobs=np.zeros(1500, dtype=np.float32), finish_reason="length"))
            client.send(hello("big"))
            got = srv.recv(5)
            assert got is not None and got[1] == hello("big")
        assert rejected("oversized") == before + 1


def test_a_frame_over_the_limit_is_refused_before_it_is_buffered_whole() -> None:
    """libzmq drops a connection whose frame is larger than the limit (``MAXMSGSIZE``) as the frame's header
    arrives: nothing of it is delivered, and the server goes on with everyone else."""
    with ControlServer("tcp://127.0.0.1:0", SECRET, max_message_bytes=10_000) as srv:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(srv.address)
        try:
            sock.send_multipart([b"x" * 20_000_000])  # 20 MB: the server holds at most its receive buffer of it
            assert srv.recv(0.5) is None
            with ControlClient(srv.address, SECRET, "after") as client:
                client.send(hello("after"))
                got = srv.recv(5)
                assert got is not None and got[1] == hello("after")
        finally:
            sock.close(0)
            ctx.term()


def test_a_peer_that_never_reads_costs_the_others_nothing(server: ControlServer) -> None:
    """A peer that connects, says Hello and never reads (a stopped dashboard, a half-open link): what the server
    sends it fills its queue and the socket buffers, then is dropped and counted; no send ever blocks, and the
    other peers' messages go both ways throughout."""
    ctx = zmq.Context()
    stalled = ctx.socket(zmq.DEALER)
    stalled.setsockopt(zmq.LINGER, 0)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.setsockopt(zmq.ROUTING_ID, b"stalled")
    stalled.connect(server.address)
    before = dropped("peer_full")
    try:
        stalled.send_multipart(sealed_hello("stalled"))
        assert server.recv(5) is not None
        with ControlClient(server.address, SECRET, "good") as good:
            good.send(hello("good"))
            assert server.recv(5) is not None
            big = m.ErrorReport(code="status", message="s" * 50_000)
            for i in range(4000):  # 200 MB: more than the peer's queue and every buffer on the way
                server.send(b"stalled", big)
                if i % 500 == 0:
                    server.send(b"good", m.ErrorReport(code="ping", message=str(i)))
                    got = good.recv(10)
                    assert got is not None and got[1].message == str(i)
                    good.send(hello("good"))
                    assert server.recv(10) is not None
            _wait_for(lambda: dropped("peer_full") > before)
            assert server.dropped > 0
    finally:
        stalled.close(0)
        ctx.term()


def test_a_client_whose_server_is_gone_never_blocks() -> None:
    """An executor's DEALER with no controller: it queues up to its high-water mark, drops the rest (counted),
    and closes at once (it used to block its sender forever)."""
    with ControlClient(f"tcp://127.0.0.1:{free_port()}", SECRET, "alone") as client:
        for _ in range(3000):
            client.send(hello("alone"))
        _wait_for(lambda: client.dropped >= 3000 - SEND_HWM)


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def dropped(reason: str) -> float:
    return float(DROPPED_MESSAGES.labels(reason)._value.get())


def test_busy_port_is_one_clear_error(server: ControlServer) -> None:
    with pytest.raises(RoseError, match=r"cannot listen on .*pick a free port"):
        ControlServer(server.address, SECRET)


@settings(max_examples=60, deadline=None)
@given(GARBAGE)
def test_a_stream_of_garbage_never_stops_the_server(garbage: list[list[bytes]]) -> None:
    with ControlServer("tcp://127.0.0.1:0", SECRET) as srv:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(srv.address)
        try:
            for frames in garbage:
                sock.send_multipart(frames)
            sock.send_multipart(sealed_hello("alive"))
            got = srv.recv(5)
            while got is not None and isinstance(got[1], m.ErrorReport):
                got = srv.recv(5)
            assert got is not None and got[1] == hello("alive")
        finally:
            sock.close(0)
            ctx.term()


def test_envelope_layout_is_stable() -> None:
    stamp = Stamp(bytes(range(16)), 7, 1.5)
    assert envelope(stamp=stamp) == MAGIC + struct.pack(">HB16sQd", m.PROTOCOL_VERSION, 0, bytes(range(16)), 7, 1.5)


def dealer(ctx: zmq.Context[zmq.Socket[bytes]], address: str, routing_id: bytes) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.connect(address)
    return sock


def test_a_captured_message_played_again_is_rejected_and_counted(server: ControlServer) -> None:
    """An executor's Hello and Goodbye as it sealed them, played again on its connection and from another one
    (what evicted a live executor before replays were checked): each is accepted once, then counted as replay."""
    sender = Framer(Signer(SECRET), m.ToController)
    captured = [sender.seal(hello("e")), sender.seal(m.Goodbye(peer_id="e", reason="bye"))]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    genuine, other = dealer(ctx, server.address, b"e"), dealer(ctx, server.address, b"x")
    before = rejected("replay")
    try:
        for frames in captured:
            genuine.send_multipart(frames)
        got = [server.recv(5), server.recv(5)]
        for frames in captured:
            genuine.send_multipart(frames)
            other.send_multipart(frames)
        deadline = time.monotonic() + 5
        while rejected("replay") < before + 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.recv(0.2) is None
    finally:
        genuine.close(0)
        other.close(0)
        ctx.term()
    assert got == [(b"e", hello("e")), (b"e", m.Goodbye(peer_id="e", reason="bye"))]
    assert rejected("replay") == before + 4


def test_nobody_takes_over_a_connected_peers_route_with_its_id(server: ControlServer) -> None:
    """No ROUTER_HANDOVER: a second connection with a live peer's routing id is refused, so what the server
    sends to that id keeps going to the first."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    first = dealer(ctx, server.address, b"e")
    second = None
    try:
        first.send_multipart(sealed_hello("e"))
        assert server.recv(5) == (b"e", hello("e"))
        second = dealer(ctx, server.address, b"e")
        second.send_multipart(sealed_hello("e"))
        assert server.recv(0.5) is None  # the second connection was refused: nothing from it arrives
        server.send(b"e", m.Welcome(controller_id="c"))
        assert first.poll(5000) and not second.poll(200)
        assert Framer(Signer(SECRET), m.FromController).open(first.recv_multipart()) == m.Welcome(controller_id="c")
    finally:
        for sock in (first, second):
            if sock is not None:
                sock.close(0)
        ctx.term()


def test_an_encrypting_server_talks_to_encrypting_clients_of_either_credential_and_to_nobody_else() -> None:
    """CurveZMQ keyed from the observer key: an executor (the secret) and a dashboard (the observer key) both
    reach it; a plain client's connection never completes (nothing it sends arrives)."""
    with ControlServer("tcp://127.0.0.1:0", SECRET, encrypt=True) as server:
        executor = ControlClient(server.address, SECRET, "exec", encrypt_with=observer_key(SECRET))
        dashboard = ControlClient(server.address, observer_key(SECRET), "tui", encrypt_with=observer_key(SECRET))
        plain = ControlClient(server.address, SECRET, "plain")
        try:
            executor.send(hello("exec"))
            dashboard.send(m.Hello(peer_id="tui", kind="observer"))
            plain.send(hello("plain"))
            got = sorted(str(server.recv(t)) for t in (5, 5, 1))
            server.send(b"exec", m.Welcome(controller_id="c"))
            assert executor.recv(5) == (b"controller", m.Welcome(controller_id="c"))
        finally:
            for client in (executor, dashboard, plain):
                client.close()
    assert got == sorted(map(str, [(b"exec", hello("exec")), (b"tui", m.Hello(peer_id="tui", kind="observer")), None]))
    assert server.encrypted


def test_unsigned_notices_are_capped_in_size_and_rate_and_never_queue_up(server: ControlServer) -> None:
    """Anyone can send an unsigned notice: one over MAX_NOTICE_BYTES is refused before it is decoded, and at
    most NOTICES_PER_S a second reach the reader (the rest are dropped and counted)."""
    framer = Framer(Signer(OTHER), m.ToController)
    small, big = framer.notice("unauthenticated", "who are you"), framer.notice("x", "y")
    big[-1] = bytes(MAX_NOTICE_BYTES)
    assert bytes(big[0]) == envelope(UNSIGNED_NOTICE)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = dealer(ctx, server.address, b"keyless")
    before = {r: rejected(r) for r in ("oversized_notice", "notice_flood")}
    try:
        sock.send_multipart(big)
        for _ in range(3 * NOTICES_PER_S):
            sock.send_multipart(small)
        deadline = time.monotonic() + 5
        while rejected("notice_flood") + rejected("oversized_notice") < sum(before.values()) + 2 * NOTICES_PER_S + 1 \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        delivered = []
        while (got := server.recv(0.2)) is not None:
            delivered.append(got[1])
    finally:
        sock.close(0)
        ctx.term()
    assert rejected("oversized_notice") == before["oversized_notice"] + 1
    assert len(delivered) + rejected("notice_flood") - before["notice_flood"] == 3 * NOTICES_PER_S
    assert NOTICES_PER_S <= len(delivered) < 3 * NOTICES_PER_S  # the sender is faster than a second
    assert all(isinstance(msg, m.ErrorReport) and msg.ref == "unsigned" for msg in delivered)
