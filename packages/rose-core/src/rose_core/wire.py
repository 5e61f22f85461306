"""Frame layout of one control-plane message and its checks, independent of the socket library.

``[envelope, mac, header, *buffers]``: ``envelope`` is ``b"ROSE"`` + protocol version (u16, big-endian)
+ flags (u8); ``mac`` is HMAC-SHA256 over envelope, header and buffers (flag ``SIGNED``), or, for
messages with bulk buffers sealed by a ``Framer(bulk_mac="poly1305")``, a one-time-key Poly1305 tag
(flag ``SIGNED_POLY1305``, see ``rose_core.auth``). Every ``Framer`` opens both; the flag is inside
what is signed, so it cannot be flipped. An unsigned error notice
(flag ``UNSIGNED_NOTICE``, zero mac) tells a peer that failed authentication or version checks why it
was rejected; it is accepted only as an ``ErrorReport`` and never acted on.

A server's ``Framer`` may also know a *guest* key (the observer key, ``rose_core.auth.observer_key``): a
message that only the guest key verifies is accepted only if ``guest_may(message)`` (else ``wrong_role``),
and ``open_keyed`` says which key it was, so replies to that peer are sealed with the guest key too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from rose_core.auth import HMAC_SHA256, MAC_BYTES, POLY1305, Signer, check_mac_scheme
from rose_core.errors import ProtocolError
from rose_core.messages import PROTOCOL_VERSION, ErrorReport
from rose_core.serde import Decoder, Encoder

MAGIC = b"ROSE"
_ENV = struct.Struct(">4sHB")
SIGNED = 0
UNSIGNED_NOTICE = 1
SIGNED_POLY1305 = 2
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
UNSIGNED_REF = "unsigned"
"""The ``ref`` of every unsigned notice a ``Framer`` opens (set by the receiver): display it, never act on it."""


def envelope(flags: int = SIGNED, version: int = PROTOCOL_VERSION) -> bytes:
    return _ENV.pack(MAGIC, version, flags)


class Framer:
    """Seals outgoing messages and opens incoming frames; one per thread. ``bulk_mac``: the signature
    of messages that carry bulk buffers (messages without stay HMAC-SHA256)."""

    def __init__(
        self,
        signer: Signer,
        decode_type: Any,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        bulk_mac: str = HMAC_SHA256,
        guest: Signer | None = None,
        guest_may: Callable[[Any], bool] | None = None,
    ):
        self._signer = signer
        self._guest = guest
        self._guest_may = guest_may or (lambda msg: False)
        self._fast_bulk = check_mac_scheme(bulk_mac) == POLY1305
        self._encoder = Encoder()
        self._decoder = Decoder(decode_type)
        self._notice_decoder = Decoder(ErrorReport)
        self._max = max_message_bytes

    def seal(self, msg: msgspec.Struct, *, guest: bool = False) -> list[Any]:
        """Frames of ``msg`` signed with the key (``guest``: the guest key, for a peer that holds only that)."""
        signer = self._guest if guest and self._guest is not None else self._signer
        payload = self._encoder.encode(msg)
        if self._fast_bulk and len(payload) > 1:
            env = envelope(SIGNED_POLY1305)
            return [env, signer.sign_fast([env, *payload]), *payload]
        env = envelope()
        return [env, signer.sign([env, *payload]), *payload]

    def notice(self, code: str, message: str) -> list[Any]:
        """An unsigned error notice for a peer we cannot (or must not) talk to."""
        payload = self._encoder.encode(ErrorReport(code=code, message=message, ref=UNSIGNED_REF))
        return [envelope(UNSIGNED_NOTICE), bytes(MAC_BYTES), *payload]

    def open(self, frames: Sequence[Any]) -> Any:
        """The decoded message, or ``ProtocolError`` naming why the frames were rejected."""
        return self.open_keyed(frames)[0]

    def open_keyed(self, frames: Sequence[Any]) -> tuple[Any, bool]:
        """``(message, signed with the guest key)``, or ``ProtocolError`` naming why it was rejected."""
        size = sum(memoryview(f).nbytes for f in frames)
        if size > self._max:
            raise ProtocolError("oversized", f"message of {size} bytes exceeds the limit of {self._max}")
        if len(frames) < 3:
            raise ProtocolError("malformed", f"message has {len(frames)} frames, needs at least 3")
        env, mac, payload = bytes(frames[0]), bytes(frames[1]), frames[2:]
        if len(env) != _ENV.size or env[:4] != MAGIC:
            raise ProtocolError("malformed", "not a ROSE frame (bad envelope)")
        _, version, flags = _ENV.unpack(env)
        if flags == UNSIGNED_NOTICE:  # its ref is ours, not the sender's: nobody can pass one off as signed
            return msgspec.structs.replace(self._notice_decoder.decode(payload), ref=UNSIGNED_REF), False
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                "wrong_version",
                f"peer speaks protocol {version}, this process speaks {PROTOCOL_VERSION}: "
                "install matching rose-core versions on both ends",
            )
        if _verified(self._signer, flags, mac, [env, *payload]):
            return self._decoder.decode(payload), False
        if self._guest is None or not _verified(self._guest, flags, mac, [env, *payload]):
            raise ProtocolError("unauthenticated", "bad signature: the peer's shared secret differs (ROSE_SECRET_FILE)")
        msg = self._decoder.decode(payload)
        if not self._guest_may(msg):
            raise ProtocolError(
                "wrong_role", f"{type(msg).__name__} signed with the observer key: an observer may only watch"
            )
        return msg, True


def _verified(signer: Signer, flags: int, mac: bytes, frames: list[Any]) -> bool:
    if flags == SIGNED:
        return signer.verify(mac, frames)
    return flags == SIGNED_POLY1305 and signer.verify_fast(mac, frames)
