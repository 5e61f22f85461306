"""Frame layout of one control-plane message and its checks, independent of the socket library.

``[envelope, mac, header, *buffers]``: ``envelope`` is ``b"ROSE"`` + protocol version (u16, big-endian)
+ flags (u8), then the sender's stamp: its session (16 random bytes per sealing ``Framer``), a sequence number
(u64, +1 per message that ``Framer`` seals) and the time it sealed the message (f64, Unix seconds), which the
receiver's ``rose_core.protocol.replay_guard`` checks so a captured message cannot be played again; ``mac`` is
HMAC-SHA256 over envelope, header and buffers (flag ``SIGNED``), or, for
messages with bulk buffers sealed by a ``Framer(bulk_mac="poly1305")``, a one-time-key Poly1305 tag
(flag ``SIGNED_POLY1305``, see ``rose_core.protocol.auth``). Every ``Framer`` opens both; the flag is inside
what is signed, so it cannot be flipped. An unsigned error notice
(flag ``UNSIGNED_NOTICE``, zero mac) tells a peer that failed authentication or version checks why it
was rejected; it is accepted only as an ``ErrorReport`` of at most ``MAX_NOTICE_BYTES`` and never acted on.

A server's ``Framer`` may also know two more kinds of key, tried after its own: a *member* key per peer
(``member(peer)``: an executor's key, ``rose_core.protocol.auth.executor_key``, derived from the peer's routing id), whose
messages are accepted only if ``member_may(peer, message)`` (else ``not_owner``: an executor speaks only for
itself), and a *guest* key (the observer key, ``rose_core.protocol.auth.observer_key``), whose messages are accepted only
if ``guest_may(message)`` (else ``wrong_role``). ``open_keyed`` says which key it was (``OWN``, ``MEMBER``,
``GUEST``), and ``seal(msg, key=..., peer=...)`` signs the replies to that peer with the same key.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeGuard

import msgspec

from rose_core.protocol.auth import HMAC_SHA256, MAC_BYTES, POLY1305, Signer, check_mac_scheme
from rose_core.protocol.messages import PROTOCOL_VERSION, ErrorReport
from rose_core.protocol.serde import Decoder, Encoder
from rose_core.support.errors import ProtocolError

MAGIC = b"ROSE"
_HEAD = struct.Struct(">4sHB")
_STAMP = struct.Struct(">16sQd")
SESSION_BYTES = 16
SIGNED = 0
UNSIGNED_NOTICE = 1
SIGNED_POLY1305 = 2
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_NOTICE_BYTES = 4096
"""The most an unsigned notice may take (all frames): anyone can send one, so a larger one is refused
(``oversized_notice``) before it is decoded; what a real one says fits many times over."""
OWN = "own"
MEMBER = "member"
GUEST = "guest"
UNSIGNED_REF = "unsigned"
"""The ``ref`` of every unsigned notice a ``Framer`` opens (set by the receiver): display it, never act on it."""


def is_unsigned_notice(msg: Any) -> TypeGuard[ErrorReport]:
    """Whether ``msg`` is an unsigned notice a ``Framer`` opened: anyone can forge one, so never act on it."""
    return isinstance(msg, ErrorReport) and msg.ref == UNSIGNED_REF


class Stamp(NamedTuple):
    """Who sealed a message and when, as its envelope says (covered by the MAC)."""

    session: bytes
    seq: int
    sent_at: float


NO_STAMP = Stamp(bytes(SESSION_BYTES), 0, 0.0)
"""The stamp an unsigned notice carries on the wire."""


def envelope(flags: int = SIGNED, version: int = PROTOCOL_VERSION, stamp: Stamp = NO_STAMP) -> bytes:
    return _HEAD.pack(MAGIC, version, flags) + _STAMP.pack(*stamp)


class Opened(NamedTuple):
    """An opened message: the message, which key verified it (``OWN``, ``MEMBER`` or ``GUEST``), and its sender's
    stamp (``None`` for an unsigned notice: nothing vouches for it, it is shown and never acted on)."""

    msg: Any
    key: str
    stamp: Stamp | None


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
        member: Callable[[bytes], Signer] | None = None,
        member_may: Callable[[bytes, Any], bool] | None = None,
    ):
        self._signer = signer
        self._guest = guest
        self._guest_may = guest_may or (lambda msg: False)
        self._member = member
        self._member_may = member_may or (lambda peer, msg: False)
        self._fast_bulk = check_mac_scheme(bulk_mac) == POLY1305
        self._encoder = Encoder()
        self._decoder = Decoder(decode_type)
        self._notice_decoder = Decoder(ErrorReport)
        self._max = max_message_bytes
        self.session = os.urandom(SESSION_BYTES)
        self._seq = itertools.count(1)

    def seal(self, msg: msgspec.Struct, *, key: str = OWN, peer: bytes = b"") -> list[Any]:
        """Frames of ``msg`` signed with the key ``peer`` holds (``key``: as ``open_keyed`` said of its messages),
        stamped with this framer's session, its next sequence number and the time."""
        signer = self._signer_for(key, peer)
        payload = self._encoder.encode(msg)
        stamp = Stamp(self.session, next(self._seq), time.time())
        if self._fast_bulk and len(payload) > 1:
            env = envelope(SIGNED_POLY1305, stamp=stamp)
            return [env, signer.sign_fast([env, *payload]), *payload]
        env = envelope(stamp=stamp)
        return [env, signer.sign([env, *payload]), *payload]

    def notice(self, code: str, message: str) -> list[Any]:
        """An unsigned error notice for a peer we cannot (or must not) talk to."""
        payload = self._encoder.encode(ErrorReport(code=code[:64], message=message[:1024], ref=UNSIGNED_REF))
        return [envelope(UNSIGNED_NOTICE), bytes(MAC_BYTES), *payload]

    def open(self, frames: Sequence[Any]) -> Any:
        """The decoded message, or ``ProtocolError`` naming why the frames were rejected."""
        return self.open_keyed(frames).msg

    def _signer_for(self, key: str, peer: bytes) -> Signer:
        if key == GUEST and self._guest is not None:
            return self._guest
        if key == MEMBER and self._member is not None:
            return self._member(peer)
        return self._signer

    def open_keyed(self, frames: Sequence[Any], peer: bytes = b"") -> Opened:
        """The message from ``peer``, which key verified it, and its stamp; or ``ProtocolError`` naming why it
        was rejected."""
        size = sum(memoryview(f).nbytes for f in frames)
        if size > self._max:
            raise ProtocolError("oversized", f"message of {size} bytes exceeds the limit of {self._max}")
        if len(frames) < 3:
            raise ProtocolError("malformed", f"message has {len(frames)} frames, needs at least 3")
        env, mac, payload = bytes(frames[0]), bytes(frames[1]), frames[2:]
        if len(env) < _HEAD.size or env[:4] != MAGIC:
            raise ProtocolError("malformed", "not a ROSE frame (bad envelope)")
        _, version, flags = _HEAD.unpack_from(env)
        if flags == UNSIGNED_NOTICE:  # its ref is ours, not the sender's: nobody can pass one off as signed
            if size > MAX_NOTICE_BYTES:
                raise ProtocolError("oversized_notice", f"unsigned notice of {size} bytes (at most {MAX_NOTICE_BYTES})")
            return Opened(msgspec.structs.replace(self._notice_decoder.decode(payload), ref=UNSIGNED_REF), OWN,
                          None)
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                "wrong_version",
                f"peer speaks protocol {version}, this process speaks {PROTOCOL_VERSION}: "
                "install matching rose-core versions on both ends",
            )
        if len(env) != _HEAD.size + _STAMP.size:
            raise ProtocolError("malformed", f"envelope of {len(env)} bytes, protocol {version} has "
                                             f"{_HEAD.size + _STAMP.size}")
        stamp = Stamp(*_STAMP.unpack_from(env, _HEAD.size))
        signed = [env, *payload]
        if _verified(self._signer, flags, mac, signed):
            return Opened(self._decoder.decode(payload), OWN, stamp)
        if self._member is not None and peer and _verified(self._member(peer), flags, mac, signed):
            msg = self._decoder.decode(payload)
            if not self._member_may(peer, msg):
                raise ProtocolError("not_owner", f"{type(msg).__name__} signed with executor "
                                                 f"{peer.decode(errors='replace')!r}'s key names another peer")
            return Opened(msg, MEMBER, stamp)
        if self._guest is None or not _verified(self._guest, flags, mac, signed):
            raise ProtocolError("unauthenticated", "bad signature: the peer's shared secret differs (ROSE_SECRET_FILE), "
                                                   "or it holds a key derived for another peer (an executor key is "
                                                   "valid only as its own executor id)")
        msg = self._decoder.decode(payload)
        if not self._guest_may(msg):
            raise ProtocolError(
                "wrong_role", f"{type(msg).__name__} signed with the observer key: an observer may only watch"
            )
        return Opened(msg, GUEST, stamp)


def _verified(signer: Signer, flags: int, mac: bytes, frames: list[Any]) -> bool:
    if flags == SIGNED:
        return signer.verify(mac, frames)
    return flags == SIGNED_POLY1305 and signer.verify_fast(mac, frames)
