"""The authenticated ZMQ channel over real sockets: happy path and every rejection reason."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import pytest
import zmq
from control_frames import BAD_FRAMES, GARBAGE, OTHER, SECRET, hello, rejected, sealed, sealed_hello
from hypothesis import given, settings

from rose_core import messages as m
from rose_core.auth import Signer
from rose_core.channel import ControlClient, ControlServer
from rose_core.errors import RoseError
from rose_core.serde import Encoder
from rose_core.wire import MAGIC, Framer, envelope


@pytest.fixture
def server() -> Iterator[ControlServer]:
    srv = ControlServer("tcp://127.0.0.1:0", SECRET)
    yield srv
    srv.close()


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
    with ControlServer("tcp://127.0.0.1:0", SECRET, max_message_bytes=10_000) as srv:
        before = rejected("oversized")
        with ControlClient(srv.address, SECRET, "big") as client:
            client.send(m.ErrorReport(code="x", message="y" * 20_000))
            client.send(hello("big"))
            got = srv.recv(5)
            assert got is not None and got[1] == hello("big")
        assert rejected("oversized") == before + 1


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
    assert envelope() == MAGIC + struct.pack(">HB", m.PROTOCOL_VERSION, 0)
