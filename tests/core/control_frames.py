"""Frames and peers for the control channel's tests, shared by the ZMQ channel's (``test_channel``) and the
in-process twin's (``test_inprocess_channel``): the same bad frames must meet the same verdicts on both."""

from __future__ import annotations

import os
import time

import numpy as np
from hypothesis import strategies as st

from rose_core.protocol import messages as m
from rose_core.protocol.auth import Signer
from rose_core.protocol.messages import PROTOCOL_VERSION
from rose_core.protocol.serde import Encoder
from rose_core.protocol.wire import SESSION_BYTES, Stamp, envelope
from rose_core.support.metrics import REJECTED_MESSAGES

SECRET = b"s" * 32
OTHER = b"o" * 32


def rejected(reason: str) -> float:
    return float(REJECTED_MESSAGES.labels(reason)._value.get())


def hello(peer: str = "e1") -> m.Hello:
    return m.Hello(peer_id=peer, kind="executor")


def sealed(header: bytes, secret: bytes = SECRET, version: int = PROTOCOL_VERSION, stamp: Stamp | None = None
           ) -> list[bytes]:
    """A one-frame message signed as a peer would sign it (``version``: the protocol it claims), stamped as the
    first message of a new session sealed now unless ``stamp`` is given."""
    env = envelope(version=version, stamp=stamp or Stamp(os.urandom(SESSION_BYTES), 1, time.time()))
    return [env, Signer(secret).sign([env, header]), header]


def sealed_hello(peer: str = "e1") -> list[bytes]:
    return sealed(Encoder().encode(hello(peer))[0])


BAD_FRAMES = [
    ([b"hello"], "malformed"),
    ([b"XXXX\x00\x01\x00", bytes(32), b"\x80"], "malformed"),
    (sealed(b"\xc1"), "malformed"),
    (sealed(Encoder().encode(m.Shutdown())[0]), "unknown_type"),  # not a message a controller receives
    (sealed(b'\x81\xa4type\xa4nope'), "unknown_type"),
]
"""``(frames, the rejection reason they must be counted under)``."""

GARBAGE = st.lists(st.lists(st.binary(max_size=64), min_size=1, max_size=5), min_size=1, max_size=8)
"""Streams of random multi-frame messages."""


def observer_only_messages(peer: str) -> list[object]:
    """Everything a controller takes from an executor (and an executor's Hello): what an observer key may not send."""
    return [
        m.Hello(peer_id=peer, kind="executor"),
        m.Register(executor_id=peer, role="serving", device="cpu", host="h", models=[], memory_bytes=1),
        m.Heartbeat(executor_id=peer, seq=1, sent_at=0.0, load=m.LoadReport()),
        m.TurnResult(turn_id="t", trajectory_id="x", attempt=0, executor_id=peer, weight_version=0,
                     output_token_ids=np.zeros(2, np.int32), output_logprobs=np.zeros(2, np.float32),
                     finish_reason="stop"),
        m.TurnAborted(turn_id="t", trajectory_id="x", attempt=0, executor_id=peer, reason="x"),
        m.WeightApplied(executor_id=peer, version=1, seconds=0.0, bytes_received=0),
    ]
