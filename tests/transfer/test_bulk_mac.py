"""Bucket replies signed with one-time-key Poly1305 (``bulk_mac="poly1305"``): accepted by every
framer with the secret, rejected when a byte, the scheme flag or the secret differs."""

from __future__ import annotations

import numpy as np
import pytest

from rose_core.protocol.auth import Signer
from rose_core.protocol.messages import BucketData, TransferReply, Welcome
from rose_core.protocol.wire import MAGIC, SIGNED, SIGNED_POLY1305, Framer
from rose_core.support.errors import ConfigError, ProtocolError

from .conftest import SECRET

FLAGS_AT = len(MAGIC) + 2
"""The envelope's flags byte: after the magic and the u16 protocol version (the sender's stamp follows)."""


def _bucket() -> BucketData:
    data = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
    return BucketData(version=3, index=1, encoding="dense", checksum="0", data=data)


def _flag(frames: list[bytes]) -> int:
    return frames[0][FLAGS_AT]


def test_buckets_are_signed_fast_and_open_anywhere() -> None:
    frames = [bytes(f) for f in Framer(Signer(SECRET), TransferReply, bulk_mac="poly1305").seal(_bucket())]
    assert _flag(frames) == SIGNED_POLY1305
    opened = Framer(Signer(SECRET), TransferReply).open(frames)
    assert opened.data.tobytes() == _bucket().data.tobytes()


def test_control_messages_stay_hmac() -> None:
    frames = Framer(Signer(SECRET), TransferReply, bulk_mac="poly1305").seal(Welcome(controller_id="p"))
    assert _flag([bytes(f) for f in frames]) == SIGNED


def test_two_seals_use_two_one_time_keys() -> None:
    framer = Framer(Signer(SECRET), TransferReply, bulk_mac="poly1305")
    assert bytes(framer.seal(_bucket())[1]) != bytes(framer.seal(_bucket())[1])


@pytest.mark.parametrize("where", ["bulk", "flag", "stamp", "secret"])
def test_tampering_is_rejected(where: str) -> None:
    frames = [bytearray(f) for f in Framer(Signer(SECRET), TransferReply, bulk_mac="poly1305").seal(_bucket())]
    secret = SECRET
    if where == "bulk":
        frames[3][100] ^= 1
    elif where == "flag":
        frames[0][FLAGS_AT] = SIGNED
    elif where == "stamp":  # the sequence number, covered by the MAC like the rest of the envelope
        frames[0][FLAGS_AT + 1 + 16 + 7] ^= 1
    else:
        secret = b"another-secret-0123456789abcdef"
    with pytest.raises(ProtocolError) as info:
        Framer(Signer(secret), TransferReply).open([bytes(f) for f in frames])
    assert info.value.reason == "unauthenticated"


def test_an_unknown_scheme_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="poly1305"):
        Framer(Signer(SECRET), TransferReply, bulk_mac="md5")
