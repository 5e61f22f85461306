"""The in-process twin of the control channel: the same framing, auth and rejections as over ZMQ, in one
process and deterministic (when ``send`` returns, the other end has opened the message)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import zmq
from control_frames import BAD_FRAMES, GARBAGE, OTHER, SECRET, hello, rejected, sealed, sealed_hello
from hypothesis import given, settings

from rose_core.protocol import messages as m
from rose_core.protocol.auth import Signer
from rose_core.protocol.serde import Encoder
from rose_core.protocol.wire import Framer
from rose_core.support.errors import RoseError
from rose_core.testing.inprocess_channel import InProcessClient, InProcessServer
from rose_core.transport.channel import ControlServer


@pytest.fixture
def server() -> Iterator[InProcessServer]:
    srv = InProcessServer(SECRET)
    yield srv
    srv.close()


def _turn_request(tokens: np.ndarray) -> m.TurnRequest:
    return m.TurnRequest(turn_id="t", trajectory_id="x", attempt=0, prompt_token_ids=tokens,
                         sampling=m.SamplingParams(), min_version=0, max_version=0)


def test_messages_flow_both_ways_with_bulk_frames(server: InProcessServer) -> None:
    with InProcessClient(server.address, SECRET, "exec-1") as client:
        client.send(hello("exec-1"))
        assert server.recv(0) == (b"exec-1", hello("exec-1"))
        tokens = np.arange(5000, dtype=np.int32)
        server.send(b"exec-1", _turn_request(tokens))
        tokens[:] = -1  # the wire holds its own bytes: changing the array after send changes nothing
        got = client.recv(0)
        assert got is not None and got[0] == b"controller" and isinstance(got[1], m.TurnRequest)
        np.testing.assert_array_equal(got[1].prompt_token_ids, np.arange(5000, dtype=np.int32))
        assert server.recv(0) is None and client.recv(0) is None


def test_bulk_arrays_travel_as_their_own_frames(server: InProcessServer) -> None:
    frames = Framer(Signer(SECRET), m.FromController).seal(_turn_request(np.arange(5000, dtype=np.int32)))
    assert len(frames) == 4  # envelope, mac, header, the array
    with InProcessClient(server.address, SECRET, "exec-1") as client:
        server.send_frames(b"exec-1", frames)
        got = client.recv(0)
        assert got is not None and isinstance(got[1], m.TurnRequest)
        np.testing.assert_array_equal(got[1].prompt_token_ids, np.arange(5000, dtype=np.int32))


def test_callbacks_run_before_send_returns(server: InProcessServer) -> None:
    seen: list[m.FromController] = []
    with InProcessClient(server.address, SECRET, "exec-1", on_message=lambda _p, msg: seen.append(msg)) as client:
        client.send(hello("exec-1"))
        server.send(b"exec-1", m.Welcome(controller_id="c"))
        assert seen == [m.Welcome(controller_id="c")]
        assert client.recv(0) is None


def test_wrong_secret_is_rejected_counted_and_told_once(server: InProcessServer) -> None:
    before = rejected("unauthenticated")
    with InProcessClient(server.address, OTHER, "intruder") as bad, \
            InProcessClient(server.address, SECRET, "good") as good:
        bad.send(hello("intruder"))
        bad.send(hello("intruder"))
        notice = bad.recv(0)
        assert notice is not None
        assert isinstance(notice[1], m.ErrorReport) and notice[1].code == "unauthenticated"
        assert "secret" in notice[1].message
        assert bad.recv(0) is None  # one notice per peer and reason
        good.send(hello("good"))
        assert server.recv(0) == (b"good", hello("good"))
    assert rejected("unauthenticated") == before + 2
    assert server.rejected == 2
    assert server.recv(0) is None


def test_wrong_version_is_rejected_with_the_fix(server: InProcessServer) -> None:
    before = rejected("wrong_version")
    with InProcessClient(server.address, SECRET, "old") as client:
        client.send_frames(sealed(Encoder().encode(hello())[0], version=99))
        notice = client.recv(0)
        assert notice is not None and isinstance(notice[1], m.ErrorReport)
        assert notice[1].code == "wrong_version" and "protocol 99" in notice[1].message
    assert rejected("wrong_version") == before + 1


@pytest.mark.parametrize(("frames", "reason"), BAD_FRAMES)
def test_bad_frames_are_rejected_and_the_server_keeps_working(
    server: InProcessServer, frames: list[bytes], reason: str
) -> None:
    before = rejected(reason)
    with InProcessClient(server.address, SECRET, "raw") as client:
        client.send_frames(frames)
        client.send_frames(sealed_hello("after"))
    assert server.recv(0) == (b"raw", hello("after"))
    assert rejected(reason) == before + 1


def _tampered(frames: list[bytes], index: int) -> list[bytes]:
    frame = bytearray(frames[index])
    frame[len(frame) // 2] ^= 0x01
    return [*frames[:index], bytes(frame), *frames[index + 1:]]


@pytest.mark.parametrize("index", [2, 3], ids=["header", "bulk"])
def test_a_tampered_frame_is_rejected_and_counted_as_over_zmq(index: int) -> None:
    """The same tampered frames, once over real sockets and once in process: the same verdict and count."""
    msg = m.TurnResult(turn_id="t", trajectory_id="x", attempt=0, executor_id="e", weight_version=0,
                       output_token_ids=np.arange(1000, dtype=np.int32),
                       output_logprobs=np.zeros(1000, dtype=np.float32), finish_reason="length")
    frames = _tampered(Framer(Signer(SECRET), m.ToController).seal(msg), index)
    counts = []
    with ControlServer("tcp://127.0.0.1:0", SECRET) as zmq_server:
        before = rejected("unauthenticated")
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.ROUTING_ID, b"e")
        raw.connect(zmq_server.address)
        try:
            raw.send_multipart(frames)
            raw.send_multipart(sealed_hello("e"))
            assert zmq_server.recv(5) == (b"e", hello("e"))
        finally:
            raw.close(0)
            ctx.term()
        counts.append((rejected("unauthenticated") - before, zmq_server.rejected))
    with InProcessServer(SECRET) as twin_server, InProcessClient(twin_server.address, SECRET, "e") as twin_client:
        before = rejected("unauthenticated")
        twin_client.send_frames(frames)
        twin_client.send(hello("e"))
        assert twin_server.recv(0) == (b"e", hello("e"))
        counts.append((rejected("unauthenticated") - before, twin_server.rejected))
    assert counts == [(1, 1), (1, 1)]


def test_oversized_messages_are_rejected() -> None:
    with InProcessServer(SECRET, max_message_bytes=10_000) as srv:
        before = rejected("oversized")
        with InProcessClient(srv.address, SECRET, "big") as client:
            client.send(m.ErrorReport(code="x", message="y" * 20_000))
            client.send(hello("big"))
            assert srv.recv(0) == (b"big", hello("big"))
        assert rejected("oversized") == before + 1


def test_a_taken_address_and_an_unknown_one_are_clear_errors(server: InProcessServer) -> None:
    with pytest.raises(RoseError, match=r"cannot listen on .*pick another address"):
        InProcessServer(SECRET, address=server.address)
    with pytest.raises(RoseError, match="no in-process controller listens on"):
        InProcessClient("inprocess://nobody", SECRET, "e")


def test_closed_ends_drop_what_is_sent(server: InProcessServer) -> None:
    client = InProcessClient(server.address, SECRET, "e")
    client.close()
    client.send(hello("e"))
    server.send(b"e", m.Welcome(controller_id="c"))
    assert server.recv(0) is None and client.recv(0) is None
    other = InProcessClient(server.address, SECRET, "f")
    server.close()
    other.send(hello("f"))
    assert server.recv(0) is None
    InProcessServer(SECRET, address=server.address).close()  # the address is free again


def test_a_second_client_with_the_id_of_a_connected_one_is_refused_until_it_is_gone(server: InProcessServer) -> None:
    first = InProcessClient(server.address, SECRET, "e")
    with pytest.raises(RoseError, match="'e' is connected already"):
        InProcessClient(server.address, SECRET, "e")
    first.close()
    with InProcessClient(server.address, SECRET, "e") as second:
        server.send(b"e", m.Welcome(controller_id="c"))
        assert first.recv(0) is None
        assert second.recv(0) == (b"controller", m.Welcome(controller_id="c"))


def test_a_captured_message_played_again_is_rejected_and_counted(server: InProcessServer) -> None:
    """The executor's own Hello and Goodbye, captured and played again (the eviction of a live executor): only
    the first delivery of each is accepted, from its connection or any other."""
    with InProcessClient(server.address, SECRET, "e") as genuine, InProcessClient(server.address, SECRET, "x") as other:
        captured = [genuine._seal(hello("e")), genuine._seal(m.Goodbye(peer_id="e", reason="bye"))]
        before = rejected("replay")
        for frames in captured:
            genuine.send_frames(frames)
        for frames in captured:
            genuine.send_frames(frames)
            other.send_frames(frames)
        got = [server.recv(0) for _ in range(3)]
    assert got == [(b"e", hello("e")), (b"e", m.Goodbye(peer_id="e", reason="bye")), None]
    assert rejected("replay") == before + 4


@settings(max_examples=60, deadline=None)
@given(GARBAGE)
def test_a_stream_of_garbage_never_stops_the_server(garbage: list[list[bytes]]) -> None:
    with InProcessServer(SECRET) as srv, InProcessClient(srv.address, SECRET, "raw") as client:
        for frames in garbage:
            client.send_frames(frames)
        client.send_frames(sealed_hello("alive"))
        got = srv.recv(0)
        while got is not None and isinstance(got[1], m.ErrorReport):
            got = srv.recv(0)
        assert got == (b"raw", hello("alive"))
