"""TLS on the weight links: a ``tls=True`` publisher serves ``tls://``, receivers pin the key the secret
derives, the bytes on the wire are not the weights', relays of it serve TLS too, and every mismatch (a server
without the secret, TLS on one end only) is refused with a message that names the fix. Real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import numpy as np
import pytest

from rose_core.support.errors import ProtocolError
from rose_transfer import DensePublisher, ResidentWeights, ShardPublisher, TransferError, WeightFetcher, load_arrays
from rose_transfer.serve.sparse_publisher import SparsePublisher
from rose_transfer.wire.frame_socket import ConnectionClosed, FrameSocket
from rose_transfer.wire.tls_link import TlsFrameSocket, server_public_key

from .conftest import SECRET, assert_same
from .test_rejections import _rejected

OTHER_SECRET = b"another-secret-0123456789abcdef!"
MARKER = np.frombuffer(b"ROSE-WEIGHTS-IN-THE-CLEAR-" * 4096, dtype=np.uint8).copy()
"""A tensor whose bytes are easy to find on the wire (106 KiB of a repeated phrase)."""


class SniffingProxy:
    """Forwards one TCP connection at a time to ``port`` and keeps every byte each side sent."""

    def __init__(self, port: int) -> None:
        self._port = port
        self.from_server = bytearray()
        self.from_client = bytearray()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, keep: bytearray) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    keep.extend(data)
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(copy(reader, up_writer, self.from_client), copy(up_reader, writer, self.from_server))


async def _fetch_through_proxy(tls: bool, tmp_path: Path) -> tuple[bytes, dict[str, np.ndarray]]:
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0, tls=tls) as publisher:
        proxy = SniffingProxy(publisher.port)
        address = await proxy.start()
        try:
            announce = publisher.publish(1, 0, {"marker": MARKER})
            scheme = "tls" if tls else "tcp"
            assert announce.source.startswith(f"{scheme}://")
            announce.source = f"{scheme}://{address}"
            fetched = await WeightFetcher(SECRET, "r0").fetch(announce, -1, tmp_path / f"{scheme}.bin")
            return bytes(proxy.from_server), load_arrays(fetched)
        finally:
            await proxy.close()


async def test_the_weights_arrive_whole_and_are_not_readable_on_the_wire(tmp_path: Path) -> None:
    plain_wire, plain = await _fetch_through_proxy(False, tmp_path)
    tls_wire, got = await _fetch_through_proxy(True, tmp_path)
    assert_same(got, {"marker": MARKER})
    assert_same(plain, {"marker": MARKER})
    phrase = b"ROSE-WEIGHTS-IN-THE-CLEAR-"
    assert phrase in plain_wire  # the check can fail: without TLS the weights cross in the clear
    assert phrase not in tls_wire and len(tls_wire) > MARKER.nbytes  # with TLS they crossed, encrypted


async def test_a_server_without_the_secret_is_refused_before_a_message_is_sent(tmp_path: Path) -> None:
    """The receiver pins the key its own secret derives: a TLS server that holds another secret (or sits in the
    middle) is refused at the handshake, named, and nothing is written."""
    with DensePublisher(secret=OTHER_SECRET, host="127.0.0.1", port=0, tls=True) as impostor:
        announce = impostor.publish(1, 0, {"marker": MARKER})
        assert server_public_key(OTHER_SECRET) != server_public_key(SECRET)
        with pytest.raises(TransferError, match=r"TLS key is not the shared secret's.*use the controller's"):
            await WeightFetcher(SECRET, "r0", max_reconnects=1).fetch(announce, -1, tmp_path / "v1.bin")
        assert impostor.rejected == 0  # it never saw a message from the receiver
    assert list(tmp_path.iterdir()) == []


async def test_tls_on_one_end_only_is_an_error_that_names_the_scheme(tmp_path: Path) -> None:
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0, tls=True) as encrypting:
        announce = encrypting.publish(1, 0, {"marker": MARKER})
        announce.source = announce.source.replace("tls://", "tcp://")
        before = _rejected("needs_tls")
        # the server answers in plain text, unsigned: shown to the operator, not trusted, and the fetch fails
        with pytest.raises(TransferError, match=r"needs_tls: this weight server speaks TLS: dial it as tls://"):
            await WeightFetcher(SECRET, "plain", max_reconnects=1).fetch(announce, -1, tmp_path / "a.bin")
        assert _rejected("needs_tls") == before + 2
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0) as plain:
        announce = plain.publish(1, 0, {"marker": MARKER})
        announce.source = announce.source.replace("tcp://", "tls://")
        with pytest.raises(TransferError, match=r"TLS handshake: is it serving tls://\? \(dial tcp:// if not\)"):
            await WeightFetcher(SECRET, "tls", max_reconnects=1).fetch(announce, -1, tmp_path / "b.bin")


def test_a_relay_of_a_tls_publisher_serves_tls_and_patches_stay_patches() -> None:
    rng = np.random.default_rng(0)
    v0 = {"w": rng.standard_normal((512, 256)).astype(np.float32)}
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, tls=True) as publisher:
        relay = publisher.start_relay("relay-remote")
        try:
            assert relay.source.startswith("tls://")
            fetcher, target = WeightFetcher(SECRET, "behind-the-relay"), ResidentWeights()
            asyncio.run(fetcher.fetch_into(publisher.publish(0, 0, v0), target, relay=relay.source))
            assert_same(target.arrays(), v0)
            first = relay.upstream_bytes
            v1 = {"w": v0["w"].copy()}
            v1["w"][:2] += 1.0
            asyncio.run(fetcher.fetch_into(publisher.publish(1, 1, v1), target, relay=relay.source))
            assert_same(target.arrays(), v1)
            assert 0 < relay.upstream_bytes - first < first // 10  # a patch crossed the encrypted link
        finally:
            relay.close()


async def test_a_plain_receiver_that_meets_tls_records_says_so() -> None:
    """Any TLS server (a TLS proxy, another product) answers a plain frame with a TLS record: the plain end
    names the scheme to use instead of reporting a frame count of 352 million."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46]))  # a TLS alert: protocol_version
        with pytest.raises(ProtocolError, match=r"the peer speaks TLS: dial it as tls://HOST:PORT"):
            await FrameSocket(ours).recv(1 << 20)


async def _publish_a_shard_through_proxy(tls: bool) -> tuple[bytes, dict[str, np.ndarray]]:
    """One trainer rank publishes ``MARKER`` through the intake of a publisher (TLS or not), via a proxy that
    keeps what the rank sent; returns those bytes and what a receiver then fetches."""
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0, tls=tls) as publisher:
        intake = publisher.open_shard_intake(1, timeout=10.0)
        scheme = "tls" if tls else "tcp"
        assert intake.startswith(f"{scheme}://")
        proxy = SniffingProxy(int(intake.rsplit(":", 1)[1]))
        address = await proxy.start()
        try:
            with ShardPublisher(secret=SECRET, intake=f"{scheme}://{address}", rank=0, ranks=1) as rank:
                announce = await asyncio.to_thread(rank.publish_shard, 1, 1, {"marker": MARKER})
        finally:
            await proxy.close()
        target = ResidentWeights()
        await WeightFetcher(SECRET, "r0").fetch_into(announce, target)
        return bytes(proxy.from_client), target.arrays()


async def test_the_shard_intake_of_a_tls_publisher_takes_the_shards_encrypted() -> None:
    """`[controller] weights_tls` covers the trainer ranks' shard intake too: the ranks dial ``tls://`` and pin
    the intake's key, and the shard's bytes are not on the wire."""
    plain_wire, plain = await _publish_a_shard_through_proxy(False)
    tls_wire, got = await _publish_a_shard_through_proxy(True)
    assert_same(plain, {"marker": MARKER})
    assert_same(got, {"marker": MARKER})
    phrase = b"ROSE-WEIGHTS-IN-THE-CLEAR-"
    assert phrase in plain_wire  # the check can fail: without TLS the shard crosses in the clear
    assert phrase not in tls_wire and len(tls_wire) > MARKER.nbytes


async def test_a_connection_closed_in_its_handshake_ends_the_handshake_and_tells_its_waiter() -> None:
    """A TLS server connection closed while it waits for the peer's handshake (the server stopping, a cap hit):
    the handshake task is cancelled, not left to fail later unseen, and whoever waited on it is told."""
    ours, theirs = socket.socketpair()
    with theirs:
        conn = TlsFrameSocket.server(ours, SECRET)
        waiter = asyncio.create_task(conn.recv(1 << 20))
        await asyncio.sleep(0.05)  # the handshake waits for the peer's first record, which never comes
        conn.close()
        with pytest.raises(ConnectionClosed, match="closed during its TLS handshake"):
            await waiter
