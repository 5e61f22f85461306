"""Frame layout of one control-plane message and its checks, independent of the socket library.

``[envelope, mac, header, *buffers]``: ``envelope`` is ``b"ROSE"`` + protocol version (u16, big-endian)
+ flags (u8); ``mac`` is HMAC-SHA256 over envelope, header and buffers. An unsigned error notice
(flag ``UNSIGNED_NOTICE``, zero mac) tells a peer that failed authentication or version checks why it
was rejected; it is accepted only as an ``ErrorReport`` and never acted on.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgspec

from rose_core.auth import MAC_BYTES, Signer
from rose_core.errors import ProtocolError
from rose_core.messages import PROTOCOL_VERSION, ErrorReport
from rose_core.serde import Decoder, Encoder

MAGIC = b"ROSE"
_ENV = struct.Struct(">4sHB")
SIGNED = 0
UNSIGNED_NOTICE = 1
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def envelope(flags: int = SIGNED, version: int = PROTOCOL_VERSION) -> bytes:
    return _ENV.pack(MAGIC, version, flags)


class Framer:
    """Seals outgoing messages and opens incoming frames; one per thread."""

    def __init__(self, signer: Signer, decode_type: Any, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self._signer = signer
        self._encoder = Encoder()
        self._decoder = Decoder(decode_type)
        self._notice_decoder = Decoder(ErrorReport)
        self._max = max_message_bytes

    def seal(self, msg: msgspec.Struct) -> list[Any]:
        payload = self._encoder.encode(msg)
        env = envelope()
        return [env, self._signer.sign([env, *payload]), *payload]

    def notice(self, code: str, message: str) -> list[Any]:
        """An unsigned error notice for a peer we cannot (or must not) talk to."""
        payload = self._encoder.encode(ErrorReport(code=code, message=message, ref="unsigned"))
        return [envelope(UNSIGNED_NOTICE), bytes(MAC_BYTES), *payload]

    def open(self, frames: Sequence[Any]) -> Any:
        """The decoded message, or ``ProtocolError`` naming why the frames were rejected."""
        size = sum(memoryview(f).nbytes for f in frames)
        if size > self._max:
            raise ProtocolError("oversized", f"message of {size} bytes exceeds the limit of {self._max}")
        if len(frames) < 3:
            raise ProtocolError("malformed", f"message has {len(frames)} frames, needs at least 3")
        env, mac, payload = bytes(frames[0]), bytes(frames[1]), frames[2:]
        if len(env) != _ENV.size or env[:4] != MAGIC:
            raise ProtocolError("malformed", "not a ROSE frame (bad envelope)")
        _, version, flags = _ENV.unpack(env)
        if flags == UNSIGNED_NOTICE:
            return self._notice_decoder.decode(payload)
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                "wrong_version",
                f"peer speaks protocol {version}, this process speaks {PROTOCOL_VERSION}: "
                "install matching rose-core versions on both ends",
            )
        if flags != SIGNED or not self._signer.verify(mac, [env, *payload]):
            raise ProtocolError(
                "unauthenticated", "bad signature: the peer's shared secret differs (ROSE_SECRET_FILE)"
            )
        return self._decoder.decode(payload)
