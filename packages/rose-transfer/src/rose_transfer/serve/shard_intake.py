"""``ShardIntake``: where the ranks of a tensor-parallel trainer send their shards of each weight version.

Per rank connection: ``Hello(kind="weights")`` -> ``Welcome``; ``ShardOffer`` (its local tensors and
specs) -> ``ShardAccepted`` once every rank of the group has offered a consistent layout (or
``ErrorReport``); then the rank's ``ShardPart``s, received straight into a buffer of one local tensor
and written into the whole version's stream on a worker thread; when every rank's bytes are in, the
version is checksummed and published and every rank gets the ``WeightAnnounce``. No byte moves
before the layouts agree; no trainer rank ever holds more than its shard; the publisher holds the
whole version, as it does for ``publish``. A version fails whole, for every rank, on bad offers, a
rank missing past ``timeout`` after the first offer, or a rank silent for ``timeout`` while sending;
it can then be published again.

With ``tls`` every rank connection is TLS 1.3 (``wire.tls_link``, the server key derived from the intake's
key, pinned by the ranks, which dial ``tls://``).

Limits before authentication, as the weight server's: at most ``max_unauthenticated`` connections before
their Hello (more are closed as they arrive, ``over_capacity``), each with ``handshake_timeout`` to send it; a
rejected frame (garbage, bad signature, oversized, no handshake) ends that connection only and is counted in
``rose_rejected_messages_total`` and ``rejected``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from rose_core.protocol.auth import Signer
from rose_core.protocol.messages import (
    ErrorReport,
    Hello,
    ShardAccepted,
    ShardIntakeRequest,
    ShardOffer,
    ShardPart,
    WeightAnnounce,
    Welcome,
)
from rose_core.protocol.wire import Framer
from rose_core.support.errors import ProtocolError, RoseError
from rose_core.support.metrics import REJECTED_MESSAGES
from rose_transfer.plan.shard_assembly import AssemblyPlan, assembly_plan
from rose_transfer.serve.pending_shards import PendingShards
from rose_transfer.version.manifest import FlatVersion
from rose_transfer.wire.accept_loop import accept_forever
from rose_transfer.wire.frame_connection import REPLY_OVERHEAD, FrameConnection
from rose_transfer.wire.frame_socket import FrameSocket
from rose_transfer.wire.tls_link import TlsFrameSocket

log = logging.getLogger(__name__)
DEFAULT_PART_BYTES = 16 * 1024 * 1024
MAX_OFFER_BYTES = 64 * 1024 * 1024  # an offer lists every tensor of a model: generous
MAX_HELLO_BYTES = 64 * 1024
"""What a connection may send before it is authenticated (a Hello is a few hundred bytes)."""


class ShardIntake:
    """Gathers versions from a group of ``ranks``; ``publish(flat, step)`` makes each one fetchable and
    returns its announcement; ``newest()`` is the newest version published; ``allocate`` gives streams."""

    def __init__(
        self,
        secret: bytes,
        *,
        ranks: int,
        publish: Callable[[FlatVersion, int], WeightAnnounce],
        newest: Callable[[], int],
        allocate: Callable[[int], np.ndarray],
        bucket_bytes: int,
        timeout: float = 60.0,
        part_bytes: int = DEFAULT_PART_BYTES,
        server_id: str = "shard-intake",
        tls: bool = False,
        max_unauthenticated: int = 64,
        handshake_timeout: float = 10.0,
    ) -> None:
        if ranks < 1 or timeout <= 0 or part_bytes <= 0:
            raise RoseError(f"a shard intake needs ranks >= 1, timeout > 0, part_bytes > 0; got {ranks}, {timeout}")
        self._secret = secret
        self.ranks = ranks
        self._publish = publish
        self._newest = newest
        self._allocate = allocate
        self._bucket_bytes = bucket_bytes
        self.timeout = timeout
        self.part_bytes = part_bytes
        self._server_id = server_id
        self.tls = tls
        self._pending: dict[int, PendingShards] = {}
        self._max_unauthenticated = max_unauthenticated
        self._handshake_timeout = handshake_timeout
        self._unauthenticated = 0
        self.rejected = 0

    async def serve(self, listener: socket.socket) -> None:
        """Accept and serve rank connections on ``listener`` until cancelled."""
        await accept_forever(listener, self._admit, "shard intake")

    def _admit(self, sock: socket.socket, _address: Any) -> Coroutine[Any, Any, None] | None:
        if self._unauthenticated >= self._max_unauthenticated:  # counted before the close the peer sees
            self._count(ProtocolError("over_capacity", f"{self._unauthenticated} connections before their handshake"))
            sock.close()
            return None
        conn = TlsFrameSocket.server(sock, self._secret) if self.tls else FrameSocket(sock)
        self._unauthenticated += 1  # counted as it is accepted: a burst cannot pass the cap before a task runs
        return self._handle(conn)

    async def _handle(self, conn: FrameConnection) -> None:
        framer = Framer(Signer(self._secret), ShardIntakeRequest, self.part_bytes + REPLY_OVERHEAD)
        authenticated = False
        try:
            hello = framer.open(await asyncio.wait_for(conn.recv(MAX_HELLO_BYTES), self._handshake_timeout))
            self._unauthenticated, authenticated = self._unauthenticated - 1, True
            offer = await self._handshake(conn, framer, hello)
            reply = await self._gather(conn, framer, offer)
            await conn.send(framer.seal(reply))
        except ProtocolError as exc:
            self._count(exc)
        except (OSError, TimeoutError) as exc:
            log.warning("shard intake connection ended: %s", exc)
        finally:
            if not authenticated:
                self._unauthenticated -= 1
            conn.close()

    def _count(self, exc: ProtocolError) -> None:
        self.rejected += 1
        REJECTED_MESSAGES.labels(exc.reason).inc()
        if self.rejected <= 20 or self.rejected % 1000 == 0:
            log.warning("shard intake refused a connection (%s): %s", exc.reason, exc)

    async def _handshake(self, conn: FrameConnection, framer: Framer, hello: object) -> ShardOffer:
        if not isinstance(hello, Hello) or hello.kind != "weights":
            raise ProtocolError("no_handshake", f"first message is {type(hello).__name__}, not a weights hello")
        await conn.send(framer.seal(Welcome(controller_id=self._server_id)))
        offer = framer.open(await asyncio.wait_for(conn.recv(MAX_OFFER_BYTES), self.timeout))
        if not isinstance(offer, ShardOffer):
            raise ProtocolError("malformed", f"expected a shard offer, got {type(offer).__name__}")
        return offer

    async def _gather(self, conn: FrameConnection, framer: Framer, offer: ShardOffer) -> WeightAnnounce | ErrorReport:
        """The rank's part of one version, start to end; the reply is its announcement or why it failed."""
        try:
            pending = self._join(offer)
        except RoseError as exc:
            return ErrorReport(code="shard_rejected", message=str(exc))
        try:
            plan = await self._accepted(pending)
            accepted = ShardAccepted(
                version=pending.version, rank=offer.rank, send=plan.sends(offer.rank), part_bytes=self.part_bytes
            )
            await conn.send(framer.seal(accepted))
            await self._receive(conn, framer, pending, plan, offer.rank)
            await self._sent(pending, plan, offer.rank)
            return await asyncio.shield(pending.published)
        except RoseError as exc:
            self._fail(pending, str(exc))
            return ErrorReport(code="shard_rejected", message=str(pending.published.exception()))
        except (OSError, TimeoutError, ProtocolError) as exc:
            why = f"{exc}" or type(exc).__name__
            self._fail(
                pending,
                f"rank {offer.rank} stopped sending weight version {pending.version} ({why}): "
                "publish the version again from every rank",
            )
            raise

    def _join(self, offer: ShardOffer) -> PendingShards:
        if offer.ranks != self.ranks:
            raise RoseError(
                f"rank {offer.rank} publishes for a group of {offer.ranks} ranks, this intake gathers {self.ranks}: "
                "open the intake with the trainer's tensor-parallel size"
            )
        if not 0 <= offer.rank < self.ranks:
            raise RoseError(f"rank {offer.rank} is outside a group of {self.ranks}: ranks are 0..{self.ranks - 1}")
        newest = self._newest()
        if offer.version <= newest:
            raise RoseError(
                f"weight version {offer.version} is not newer than the published {newest}: "
                "publish each version once, in increasing order"
            )
        pending = self._pending.get(offer.version)
        if pending is None:
            deadline = asyncio.get_running_loop().time() + self.timeout
            pending = self._pending[offer.version] = PendingShards(offer.version, offer.step, self.ranks, deadline)
        try:
            pending.join(offer)
        except RoseError as exc:
            self._fail(pending, str(exc))
            raise
        return pending

    async def _accepted(self, pending: PendingShards) -> AssemblyPlan:
        """The plan, once every rank offered (the last rank to offer checks the offers and allocates)."""
        if not pending.missing and not pending.accepted.done():
            plan = await asyncio.to_thread(assembly_plan, pending.offers, pending.ranks)
            pending.stream = self._allocate(plan.total)
            await asyncio.to_thread(plan.zero_padding, pending.stream)
            pending.accepted.set_result(plan)
        left = pending.deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(asyncio.shield(pending.accepted), max(left, 0.0))
        except TimeoutError:
            self._fail(
                pending,
                f"ranks {pending.missing} of {pending.ranks} did not offer weight version {pending.version} "
                f"within {self.timeout:g} s of the first: call publish_shard on every rank (or raise the timeout)",
            )
            return await pending.accepted

    async def _receive(
        self, conn: FrameConnection, framer: Framer, pending: PendingShards, plan: AssemblyPlan, rank: int
    ) -> None:
        """Each tensor the rank sends, part by part in order, into a local buffer, then into the stream."""
        stream = pending.stream
        if stream is None:
            raise RuntimeError("an accepted version has its stream")
        for name in plan.sends(rank):
            local = np.empty(plan.local_nbytes[rank][name], dtype=np.uint8)
            for at in range(0, local.nbytes, self.part_bytes):
                region = local[at : at + self.part_bytes]
                frames = await conn.recv(self.part_bytes + REPLY_OVERHEAD, region.data, idle_timeout=self.timeout)
                part = await asyncio.to_thread(framer.open, frames)
                _check_part(part, pending.version, rank, name, at, region.nbytes)
                if not np.may_share_memory(part.data, region):
                    region[:] = part.data.reshape(-1).view(np.uint8)
            if not pending.failed:  # keep reading: the rank then gets the failure, not a reset
                await asyncio.to_thread(plan.fill, rank, name, local, stream)

    async def _sent(self, pending: PendingShards, plan: AssemblyPlan, rank: int) -> None:
        """Record that ``rank``'s bytes are in; the last rank's connection publishes the version."""
        pending.sent.add(rank)
        if len(pending.sent) < pending.ranks or pending.published.done() or pending.stream is None:
            return
        flat = await asyncio.to_thread(
            plan.version, pending.stream, version=pending.version, bucket_bytes=self._bucket_bytes
        )
        announce = self._publish(flat, pending.step)
        self._pending.pop(pending.version, None)
        pending.published.set_result(announce)

    def _fail(self, pending: PendingShards, message: str) -> None:
        if not pending.published.done():
            log.warning("weight version %d from the shard intake failed: %s", pending.version, message)
        pending.fail(message)
        if self._pending.get(pending.version) is pending:
            del self._pending[pending.version]


def _check_part(part: object, version: int, rank: int, name: str, offset: int, nbytes: int) -> None:
    if not isinstance(part, ShardPart):
        raise ProtocolError("malformed", f"expected a shard part, got {type(part).__name__}")
    got = (part.version, part.rank, part.name, part.offset, part.data.nbytes)
    if got != (version, rank, name, offset, nbytes):
        raise ProtocolError(
            "malformed",
            f"rank {rank} sent part {got} where (version, rank, tensor, offset, bytes) "
            f"{(version, rank, name, offset, nbytes)} was due",
        )

