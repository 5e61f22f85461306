"""TLS on the weight links (``tls://HOST:PORT``), keyed by the shared secret: no certificate files.

Every holder of the secret (the publisher, each relay) derives the same server key, an Ed25519 key whose
seed is ``HMAC-SHA256(secret, "rose-weights-tls")``, and serves a self-signed certificate for it. A receiver
accepts a server only if its certificate carries that public key (pinned; checked right after the
handshake, before a byte of a message is sent), so whoever lacks the secret can neither read the weights on
the wire nor stand in the middle. TLS 1.3 only. Authentication of each message stays the MAC's
(``rose_core.protocol.wire``): TLS adds confidentiality; a receiver still proves itself with its signed ``Hello``.

``TlsFrameSocket`` is a ``FrameSocket`` whose bytes go through an ``ssl.SSLObject`` over memory BIOs, on the
same non-blocking socket and event loop (no second stream API). The handshake runs on the first send or
receive, so a server counts and times it like the rest of a connection's handshake.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import hashlib
import hmac
import socket
import ssl
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

from rose_core.protocol.auth import write_private
from rose_core.support.errors import ProtocolError
from rose_transfer.wire.frame_socket import ConnectionClosed, FrameSocket
from rose_transfer.wire.send_gate import SendGate

_KEY_LABEL = b"rose-weights-tls"
_RECORD_BATCH = 256 * 1024
"""Plaintext handed to the TLS object per write (its records go out together): bounds the ciphertext held."""
_READ_BYTES = 256 * 1024
_HANDSHAKE_RECORD = 0x16


class UntrustedServer(ConnectionError):
    """The server's TLS key is not the one the shared secret derives: not a holder of the secret."""


def server_key(secret: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest())


def server_public_key(secret: bytes) -> bytes:
    """The raw public key a receiver expects the weight server's certificate to carry."""
    return server_key(secret).public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@functools.lru_cache(maxsize=4)
def server_context(secret: bytes) -> ssl.SSLContext:
    """A TLS 1.3 server context with a fresh self-signed certificate for the secret's derived key."""
    key = server_key(secret)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rose-weights")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key, None)
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    with tempfile.TemporaryDirectory(prefix="rose-tls-") as private:  # mode 0700; ssl loads only from files
        cert_path, key_path = Path(private, "cert.pem"), Path(private, "key.pem")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
        context.load_cert_chain(cert_path, key_path)
    return context


@functools.lru_cache(maxsize=1)
def client_context() -> ssl.SSLContext:
    """TLS 1.3, no CA and no host name: the server is checked by its pinned key (``TlsFrameSocket``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class TlsFrameSocket(FrameSocket):
    """A ``FrameSocket`` over TLS. ``pinned``: the client's expected server public key (None on the server)."""

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        pinned: bytes | None = None,
        stall_timeout: float = 60.0,
        gate: SendGate | None = None,
    ) -> None:
        if not server_side and pinned is None:
            raise ValueError("a TLS client needs the server's pinned key")
        super().__init__(sock, stall_timeout, gate)
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side)
        self._pinned = pinned
        self._handshake: asyncio.Task[None] | None = None
        self.plaintext_peer = False
        """The server found the peer speaking plain ROSE frames, not TLS: what it sends back (the notice that
        names the fix) goes in plaintext, the only thing that peer can read."""

    @classmethod
    def client(cls, sock: socket.socket, secret: bytes) -> TlsFrameSocket:
        return cls(sock, client_context(), server_side=False, pinned=server_public_key(secret))

    @classmethod
    def server(cls, sock: socket.socket, secret: bytes, gate: SendGate | None = None) -> TlsFrameSocket:
        return cls(sock, server_context(secret), server_side=True, gate=gate)

    async def handshake(self) -> None:
        """Run the TLS handshake (once; later calls wait for the first) and, as a client, check the pin."""
        if self._handshake is None:
            self._handshake = asyncio.ensure_future(self._run_handshake())
        handshake = self._handshake
        try:
            await asyncio.shield(handshake)
        except asyncio.CancelledError:
            if handshake.cancelled():  # ``close`` ended it; this waiter was not cancelled itself
                raise ConnectionClosed("the connection was closed during its TLS handshake") from None
            raise

    def close(self) -> None:
        """Close the socket; a handshake still running ends now (cancelled, its waiters told the link closed)."""
        if self._handshake is not None and not self._handshake.done():
            self._handshake.cancel()
        super().close()

    async def _recv(self, max_bytes: int, bulk_into: memoryview | None) -> list[Any]:
        await self.handshake()
        return await super()._recv(max_bytes, bulk_into)

    # ---------------------------------------------------------------- the byte stream under the frames

    async def send(self, frames: Sequence[Any]) -> None:
        if not self.plaintext_peer:
            await self.handshake()
        await super().send(frames)

    async def _send_bytes(self, view: memoryview) -> None:
        if self.plaintext_peer:
            await super()._send_bytes(view)
            return
        for start in range(0, view.nbytes, _RECORD_BATCH):
            self._tls.write(view[start : start + _RECORD_BATCH])
            await self._flush()

    async def _recv_into(self, target: memoryview) -> int:
        while True:
            try:
                n = cast(int, self._tls.read(target.nbytes, target))  # into a buffer: a count (typeshed says bytes)
            except ssl.SSLWantReadError:
                await self._fill()
                continue
            except ssl.SSLZeroReturnError:
                raise ConnectionClosed("the peer closed the TLS session") from None
            except ssl.SSLError as exc:
                raise ConnectionClosed(f"TLS error from the peer: {exc.reason or exc}") from exc
            if n == 0:
                raise ConnectionClosed("the peer closed the TLS session")
            self.bytes_received += n
            return n

    async def _run_handshake(self) -> None:
        if self._pinned is None:  # the server: a peer that does not open with a TLS record gets told, in plain
            first = await self._loop.sock_recv(self.sock, _READ_BYTES)
            if not first:
                raise ConnectionClosed("the peer closed the connection before its TLS handshake")
            if first[0] != _HANDSHAKE_RECORD:
                self.plaintext_peer = True
                raise ProtocolError("needs_tls", "this weight server speaks TLS: dial it as tls://HOST:PORT")
            self._incoming.write(first)
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                try:
                    await self._fill()
                except ConnectionClosed:
                    raise ConnectionClosed(
                        "the peer closed the connection in the TLS handshake: is it serving tls://? (dial tcp:// if not)"
                    ) from None
            except ssl.SSLError as exc:
                await self._flush()  # the alert, if any, tells the peer why
                raise ConnectionClosed(f"TLS handshake failed: {exc.reason or exc}") from exc
        await self._flush()
        if self._pinned is not None:
            self._check_pin()

    def _check_pin(self) -> None:
        der = self._tls.getpeercert(binary_form=True)
        key = x509.load_der_x509_certificate(der).public_key() if der else None
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) \
            if isinstance(key, Ed25519PublicKey) else b""
        if not hmac.compare_digest(raw, self._pinned or b""):
            raise UntrustedServer(
                "the weight server's TLS key is not the shared secret's: it does not hold this receiver's secret "
                "(or someone is in the middle); give both ends the controller's secret"
            )

    async def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            await self._loop.sock_sendall(self.sock, data)

    async def _fill(self) -> None:
        data = await self._loop.sock_recv(self.sock, _READ_BYTES)
        if not data:
            raise ConnectionClosed("the peer closed the connection in the middle of a TLS record")
        self._incoming.write(data)
