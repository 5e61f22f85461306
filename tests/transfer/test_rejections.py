"""Unauthenticated, malformed and oversized traffic is dropped and counted; the publisher keeps serving."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from rose_core.protocol.auth import Signer
from rose_core.protocol.messages import FetchManifest, Hello, TransferReply, TransferRequest, Welcome
from rose_core.protocol.wire import Framer
from rose_transfer import DensePublisher, TransferError, WeightFetcher, load_arrays

from .conftest import SECRET, assert_same, random_state_dict


def _rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("rose_rejected_messages_total", {"reason": reason}) or 0.0


def _frame(frames: list[bytes]) -> bytes:
    return struct.pack(f">I{len(frames)}Q", len(frames), *map(len, frames)) + b"".join(frames)


def _exchange(port: int, payload: bytes, timeout: float = 5.0) -> bytes:
    """Send ``payload``, half-close, and read until the publisher closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def _ask(port: int, payload: bytes, until: bytes, timeout: float = 5.0) -> bytes:
    """Send ``payload`` and read until ``until`` arrives or the publisher closes the connection (no half-close:
    a server drops the replies still being prepared when its peer is gone)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        received = b""
        while until not in received and (chunk := sock.recv(65536)):
            received += chunk
        return received


async def _still_serves(publisher: DensePublisher, tmp_path: Path, version: int) -> None:
    tensors = random_state_dict(seed=version)
    announce = publisher.publish(version, 0, tensors)
    fetched = await WeightFetcher(SECRET, "after").fetch(announce, -1, tmp_path / f"v{version}.bin")
    assert_same(load_arrays(fetched), tensors)


async def test_bad_secret_is_rejected_counted_and_named(publisher: DensePublisher, tmp_path: Path) -> None:
    announce = publisher.publish(1, 0, random_state_dict())
    before = _rejected("unauthenticated")
    intruder = WeightFetcher(b"not-the-secret-0123456789abcdef", "intruder", max_reconnects=1)
    # the publisher's answer is an unsigned notice, which the receiver cannot trust: it tries again, then names it
    with pytest.raises(TransferError, match=r"unsigned notice \(unauthenticated: bad signature: the peer's shared "
                                            r"secret differs.*2 tries\): if that is the publisher, its shared secret "
                                            r"differs from this receiver's"):
        await intruder.fetch(announce, -1, tmp_path / "v1.bin")
    assert _rejected("unauthenticated") == before + 2
    assert publisher.rejected == 2
    assert list(tmp_path.iterdir()) == []
    await _still_serves(publisher, tmp_path, 2)


def test_request_before_hello_is_rejected(publisher: DensePublisher) -> None:
    before = _rejected("no_handshake")
    framer = Framer(Signer(SECRET), TransferRequest)
    reply = _exchange(publisher.port, _frame([bytes(f) for f in framer.seal(FetchManifest(version=1))]))
    assert b"no_handshake" in reply  # the unsigned notice names the reason
    assert _rejected("no_handshake") == before + 1


async def test_a_captured_request_played_again_is_rejected_and_counted(publisher: DensePublisher,
                                                                      tmp_path: Path) -> None:
    """A receiver's Hello and manifest request, captured and sent again on a new connection: the first time they
    are served, the second time refused as ``replay`` (counted), and the publisher goes on serving."""
    publisher.publish(1, 0, random_state_dict())
    framer = Framer(Signer(SECRET), TransferRequest)
    captured = b"".join(_frame([bytes(f) for f in framer.seal(msg)])
                        for msg in (Hello(peer_id="r", kind="weights"), FetchManifest(version=1)))
    assert b"weight_manifest" in _ask(publisher.port, captured, until=b"weight_manifest")  # genuine: answered
    before = _rejected("replay")
    assert b"weight_manifest" not in _ask(publisher.port, captured, until=b"weight_manifest")
    assert _rejected("replay") == before + 1
    await _still_serves(publisher, tmp_path, 2)


def test_oversized_request_is_rejected_before_it_is_read(publisher: DensePublisher) -> None:
    before = _rejected("oversized")
    _exchange(publisher.port, struct.pack(">IQ", 1, 1 << 40))
    assert _rejected("oversized") == before + 1


def test_wrong_protocol_version_is_rejected(publisher: DensePublisher) -> None:
    before = _rejected("wrong_version")
    frames = [bytes(f) for f in Framer(Signer(SECRET), TransferRequest).seal(Hello(peer_id="old", kind="weights"))]
    frames[0] = frames[0][:4] + struct.pack(">H", 999) + frames[0][6:]
    reply = _exchange(publisher.port, _frame(frames))
    assert b"install matching rose-core versions" in reply
    assert _rejected("wrong_version") == before + 1


def test_controller_peers_are_told_where_to_go(publisher: DensePublisher) -> None:
    frames = [bytes(f) for f in Framer(Signer(SECRET), TransferRequest).seal(Hello(peer_id="e", kind="executor"))]
    assert b"this is a weight publisher, not a controller" in _exchange(publisher.port, _frame(frames))


def test_silent_peers_are_dropped_after_the_handshake_timeout(publisher: DensePublisher) -> None:
    publisher._server._handshake_timeout = 0.2  # a slowloris would hold a connection forever otherwise
    with socket.create_connection(("127.0.0.1", publisher.port), timeout=5) as sock:
        sock.sendall(b"\x00\x00")
        assert sock.recv(100) == b""


_garbage = st.one_of(
    st.binary(max_size=4096),
    st.lists(st.binary(max_size=512), min_size=1, max_size=20).map(_frame),
    st.lists(st.binary(max_size=64), min_size=3, max_size=4).map(lambda fs: _frame([b"ROSE\x00\x01\x00", *fs[1:]])),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=_garbage)
def test_garbage_never_kills_the_server(publisher: DensePublisher, payload: bytes) -> None:
    _exchange(publisher.port, payload)
    # Every connection is answered or closed; a well-formed handshake still works afterwards.
    frames = [bytes(f) for f in Framer(Signer(SECRET), TransferRequest).seal(Hello(peer_id="ok", kind="weights"))]
    assert b"welcome" in _exchange(publisher.port, _frame(frames))


async def test_garbage_then_a_real_fetch(publisher: DensePublisher, tmp_path: Path) -> None:
    before = _rejected("malformed")
    await asyncio.to_thread(_exchange, publisher.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _rejected("malformed") == before + 1
    await _still_serves(publisher, tmp_path, 1)


async def test_connections_over_the_caps_are_closed_as_they_arrive_and_counted(tmp_path: Path) -> None:
    """Two silent connections hold both slots for unauthenticated peers: the next is closed at once and counted
    (never read); once they are gone, receivers are served again."""
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0, max_unauthenticated=2) as capped:
        before = _rejected("over_capacity")
        silent = [socket.create_connection(("127.0.0.1", capped.port)) for _ in range(2)]
        try:
            await asyncio.sleep(0.2)
            refused = await asyncio.to_thread(_exchange, capped.port, b"")
            assert refused == b"" and _rejected("over_capacity") == before + 1
        finally:
            for sock in silent:
                sock.close()
        await asyncio.sleep(0.2)
        await _still_serves(capped, tmp_path, 1)
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0, max_connections=1) as one:
        announce = one.publish(1, 0, random_state_dict())
        holder = socket.create_connection(("127.0.0.1", one.port))
        try:
            await asyncio.sleep(0.2)
            with pytest.raises(TransferError, match="cannot fetch weight version 1"):
                await WeightFetcher(SECRET, "second", max_reconnects=1).fetch(announce, -1, tmp_path / "v.bin")
        finally:
            holder.close()
        assert _rejected("over_capacity") >= before + 3


async def _read_frames(reader: asyncio.StreamReader) -> list[bytes]:
    count = struct.unpack(">I", await reader.readexactly(4))[0]
    sizes = struct.unpack(f">{count}Q", await reader.readexactly(8 * count))
    return [await reader.readexactly(size) for size in sizes]


async def test_a_forged_unsigned_notice_in_place_of_a_reply_is_not_acted_on(
    publisher: DensePublisher, tmp_path: Path
) -> None:
    """A peer on the path answers the manifest request with an unsigned notice (anyone can forge one): the
    receiver treats the connection as broken, falls back to the source and gets the version bit-exact."""
    replies = Framer(Signer(SECRET), TransferReply)

    async def forge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_frames(reader)  # Hello: answered as the publisher would (a genuine relay, say)
        writer.write(_frame([bytes(f) for f in replies.seal(Welcome(controller_id="relay"))]))
        await _read_frames(reader)  # the manifest request: a forged notice in its place
        writer.write(_frame([bytes(f) for f in replies.notice("unknown_version", "forged: no such version")]))
        await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(forge, "127.0.0.1", 0)
    tensors = random_state_dict(seed=7)
    announce = publisher.publish(1, 0, tensors)
    try:
        relay = f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        fetched = await WeightFetcher(SECRET, "r", max_reconnects=2).fetch(announce, -1, tmp_path / "v.bin",
                                                                            relay=relay)
    finally:
        server.close()
    assert_same(load_arrays(fetched), tensors)
