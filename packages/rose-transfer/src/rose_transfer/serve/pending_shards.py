"""``PendingShards``: one weight version a shard intake is gathering from the ranks of a group.

It lives on the intake's event loop only. Ranks join it with their offers; once all ``ranks`` have
offered (within ``deadline``), ``accepted`` holds the ``AssemblyPlan`` and ``stream`` the whole
version's buffer, which each rank's bytes fill; once every rank's bytes are in, ``published`` holds the
announcement. Any failure (bad offers, a rank that never offers, one that stops sending) fails both
futures with one message every waiting rank gets; nothing of the version is published then.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from rose_core.protocol.messages import ShardOffer, TensorEntry, WeightAnnounce
from rose_core.support.errors import RoseError
from rose_transfer.plan.shard_assembly import AssemblyPlan


@dataclass(slots=True)
class PendingShards:
    version: int
    step: int
    ranks: int
    deadline: float  # loop time by which every rank must have offered
    offers: dict[int, list[TensorEntry]] = field(default_factory=dict)
    accepted: asyncio.Future[AssemblyPlan] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    published: asyncio.Future[WeightAnnounce] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    stream: np.ndarray | None = None
    sent: set[int] = field(default_factory=set)  # ranks whose bytes are all in

    def join(self, offer: ShardOffer) -> None:
        """Record ``offer``; ``RoseError`` if its rank already offered or its step differs."""
        if offer.rank in self.offers:
            raise RoseError(
                f"two processes offered rank {offer.rank} of weight version {self.version}: "
                "give every process of the group its own rank"
            )
        if offer.step != self.step:
            raise RoseError(
                f"rank {offer.rank} publishes weight version {self.version} as step {offer.step}, "
                f"another rank as step {self.step}: publish each version at one step on every rank"
            )
        self.offers[offer.rank] = list(offer.tensors)

    @property
    def missing(self) -> list[int]:
        return [rank for rank in range(self.ranks) if rank not in self.offers]

    @property
    def failed(self) -> bool:
        return self.published.done() and self.published.exception() is not None

    def fail(self, message: str) -> None:
        """Fail the version for every rank still waiting (the first failure's message wins)."""
        for future in (self.accepted, self.published):
            if not future.done():
                future.set_exception(RoseError(message))
                future.exception()  # retrieved: a rank that never waits on it is no error
