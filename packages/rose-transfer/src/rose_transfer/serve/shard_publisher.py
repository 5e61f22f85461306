"""``ShardPublisher``: one rank of a tensor-parallel trainer publishes its shards of each weight version.

Every rank ``r`` of a group of ``n`` calls ``publish_shard(version, step, local_tensors, specs)`` with
the tensors it holds (numpy arrays or torch tensors, on any device) and the shard spec text of each
sharded one (``plan.shard_spec``; the rest are replicated and every rank passes them whole). The
publisher's shard intake (``DensePublisher.open_shard_intake``) checks that the ranks agree, takes
each byte from the one rank that holds it, and serves the version exactly as ``publish`` of the full
state dict would; every rank's call returns the same ``WeightAnnounce`` once the whole version is
fetchable, or raises ``TransferError`` naming why it is not (then nothing of it was published). No
collective runs and no rank gathers the model; a rank's tensors go to host one at a time, as sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypeVar

from rose_core.protocol.auth import MIN_SECRET_BYTES, POLY1305, Signer
from rose_core.protocol.messages import (
    ErrorReport,
    Hello,
    ShardAccepted,
    ShardIntakeReply,
    ShardOffer,
    ShardPart,
    WeightAnnounce,
    Welcome,
)
from rose_core.protocol.wire import DEFAULT_MAX_MESSAGE_BYTES, Framer
from rose_core.support.errors import ConfigError, ProtocolError, RoseError
from rose_transfer._version import __version__
from rose_transfer.errors import TransferError
from rose_transfer.plan.shard_spec import ShardSpec
from rose_transfer.version.manifest import layout, travel_bytes
from rose_transfer.wire.connect import open_connection
from rose_transfer.wire.frame_connection import FrameConnection
from rose_transfer.wire.loop_thread import LoopThread

T = TypeVar("T")


class ShardPublisher:
    """Rank ``rank`` of ``ranks``, publishing through the shard intake at ``intake`` (``tcp://host:port``).
    ``timeout``: how long to wait for the intake's answers before the bytes move (set it above the
    intake's own timeout, which bounds the wait for the other ranks)."""

    def __init__(self, *, secret: bytes, intake: str, rank: int, ranks: int, timeout: float = 120.0) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ConfigError(f"the shared secret is {len(secret)} bytes; use at least {MIN_SECRET_BYTES}")
        if not 0 <= rank < ranks:
            raise ConfigError(f"rank {rank} is outside a tensor-parallel group of {ranks}: ranks are 0..{ranks - 1}")
        if timeout <= 0:
            raise ConfigError(f"the shard publisher's timeout must be positive, got {timeout}")
        self._secret = secret
        self.intake = intake
        self.rank = rank
        self.ranks = ranks
        self.timeout = timeout
        self._thread = LoopThread(f"rose-shard-publisher-{rank}")

    def publish_shard(
        self, version: int, step: int, tensors: Mapping[str, Any], specs: Mapping[str, str] | None = None
    ) -> WeightAnnounce:
        """Send this rank's part of ``version`` and return its announcement once every rank's part is in
        and the whole version is fetchable. ``specs``: tensor name -> shard spec text (``column``,
        ``row``, ``vocab;pad=64``, ``qkv;sections=...``, ``gate_up;sections=...``); others replicated."""
        entries, _ = layout(tensors, _checked_specs(tensors, specs or {}))
        offer = ShardOffer(version=version, step=step, rank=self.rank, ranks=self.ranks, tensors=entries)
        return self._thread.submit(self._publish(offer, tensors)).result()

    async def _publish(self, offer: ShardOffer, tensors: Mapping[str, Any]) -> WeightAnnounce:
        try:
            conn = await open_connection(self.intake, self.timeout, self._secret)
        except (OSError, TimeoutError) as exc:
            raise self._unreachable(offer.version, exc) from exc
        framer = Framer(Signer(self._secret), ShardIntakeReply, DEFAULT_MAX_MESSAGE_BYTES, bulk_mac=POLY1305)
        try:
            hello = Hello(peer_id=f"trainer-rank-{self.rank}", kind="weights", software=f"rose-transfer {__version__}")
            await self._expect(conn, framer, hello, Welcome, offer.version)
            accepted = await self._expect(conn, framer, offer, ShardAccepted, offer.version)
            for name in accepted.send:
                data = travel_bytes(tensors[name])
                for at in range(0, data.nbytes, accepted.part_bytes):
                    chunk = data[at : at + accepted.part_bytes]
                    part = ShardPart(version=offer.version, rank=self.rank, name=name, offset=at, data=chunk)
                    await conn.send(framer.seal(part))
            return await self._expect(conn, framer, None, WeightAnnounce, offer.version, bounded=False)
        except (OSError, TimeoutError, ProtocolError) as exc:
            raise self._unreachable(offer.version, exc) from exc
        finally:
            conn.close()

    async def _expect(
        self, conn: FrameConnection, framer: Framer, msg: Any, kind: type[T], version: int, bounded: bool = True
    ) -> T:
        """Send ``msg`` (unless None) and return the reply if it is a ``kind``; an ``ErrorReport`` raises
        ``TransferError`` with the intake's reason. ``bounded``: wait at most ``timeout`` for the reply
        (the final announcement waits for the slowest rank's bytes; the intake bounds that)."""
        if msg is not None:
            await conn.send(framer.seal(msg))
        receiving = conn.recv(DEFAULT_MAX_MESSAGE_BYTES)
        frames = await (asyncio.wait_for(receiving, self.timeout) if bounded else receiving)
        reply = framer.open(frames)
        if isinstance(reply, ErrorReport):
            raise TransferError(
                f"rank {self.rank}'s part of weight version {version} was refused by {self.intake}: {reply.message}"
            )
        if not isinstance(reply, kind):
            raise TransferError(f"{self.intake} answered with {type(reply).__name__}: is it a shard intake?")
        return reply

    def _unreachable(self, version: int, exc: BaseException) -> TransferError:
        why = f"no answer for {self.timeout:g} s" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        return TransferError(
            f"rank {self.rank} cannot publish its part of weight version {version} through {self.intake} "
            f"({why}): check that the publisher's shard intake runs and is reachable"
        )

    def close(self) -> None:
        self._thread.stop()

    def __enter__(self) -> ShardPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _checked_specs(tensors: Mapping[str, Any], specs: Mapping[str, str]) -> dict[str, str]:
    """``specs`` if each names a tensor given and parses; else ``ConfigError`` / ``RoseError`` naming it."""
    unknown = sorted(set(specs) - set(tensors))
    if unknown:
        raise ConfigError(f"shard specs name {unknown}, which this rank does not publish: fix the names")
    for name, text in specs.items():
        try:
            ShardSpec.parse(text)
        except RoseError as exc:
            raise RoseError(f"{name}: {exc}") from exc
    return dict(specs)
