"""What one benchmark receiver does: fetch a version (some way) into the weights it holds in memory
(``ResidentWeights``), then copy its own slice of every tensor out of them into its weight buffers
(allocated once and reused, as an engine's weights are). Both systems do exactly this; neither writes
a file. Each run's slices are then reduced to xxh64 digests, compared after the timing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import xxhash

from rose_core.protocol.messages import TensorEntry
from rose_transfer.plan.shard_plan import CopySegment, assemble, receiver_segments
from rose_transfer.resident.resident_weights import ResidentWeights
from rose_transfer.version.fetched_version import FetchedInMemory


@dataclass(slots=True)
class Slicer:
    """The segments rank ``rank`` of ``tp`` reads from the flat stream, per tensor."""

    tp: int
    rank: int
    plans: dict[str, list[CopySegment]] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # this rank's weight buffers (uint8)

    @classmethod
    def of(cls, entries: list[TensorEntry], tp: int, rank: int) -> Slicer:
        plans = receiver_segments(entries, tp, rank)
        weights = {name: np.zeros(sum(s.total_bytes for s in plan), dtype=np.uint8) for name, plan in plans.items()}
        return cls(tp, rank, plans, weights)

    def trim(self, stream: np.ndarray) -> dict[str, np.ndarray]:
        """Copy each tensor's local slice out of ``stream`` into this rank's weight buffers."""
        for name, segments in self.plans.items():
            assemble(segments, [stream], self.weights[name])
        return self.weights

    def digests(self, slices: dict[str, np.ndarray] | None = None) -> dict[str, str]:
        return digests(slices or self.weights)


@dataclass(slots=True)
class ReceiverRun:
    name: str
    bytes_received: int
    seconds: float
    digests: dict[str, str] = field(default_factory=dict)  # of its slices, filled after the timing


async def fetch_and_trim(
    name: str, fetch: Callable[[], Awaitable[FetchedInMemory]], held: ResidentWeights, slicer: Slicer | None
) -> ReceiverRun:
    """Fetch, then copy the slice out (``slicer``; None for a receiver holding its shard view, whose
    resident weights are already its engine's local tensors)."""
    started = time.perf_counter()
    fetched = await fetch()
    if slicer is not None:
        await asyncio.to_thread(_trim_held, held, slicer)
    return ReceiverRun(name, fetched.bytes_received, time.perf_counter() - started)


def digests(arrays: dict[str, np.ndarray]) -> dict[str, str]:
    """xxh64 of each array's bytes: a trimmed slice, or a local tensor a shard view holds."""
    return {
        name: xxhash.xxh64(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data).hexdigest()
        for name, array in arrays.items()
    }


def _trim_held(held: ResidentWeights, slicer: Slicer) -> dict[str, np.ndarray]:
    with held.lock:
        return slicer.trim(held.stream)
