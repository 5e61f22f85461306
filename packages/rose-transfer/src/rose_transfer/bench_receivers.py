"""What one benchmark receiver does: fetch a version (some way) into a file, then copy its own slice of
every tensor out of it into its weight buffers (allocated once and reused, as an engine's weights are).
Each run's slices are then reduced to xxh64 digests, compared after the timing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from rose_core.messages import TensorEntry
from rose_transfer.fetched_version import FetchedVersion
from rose_transfer.shard_plan import CopySegment, assemble, receiver_segments


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
        return {name: xxhash.xxh64(array.data).hexdigest() for name, array in (slices or self.weights).items()}


@dataclass(slots=True)
class ReceiverRun:
    name: str
    bytes_received: int
    seconds: float
    digests: dict[str, str] = field(default_factory=dict)  # of its slices, filled after the timing


async def fetch_and_trim(name: str, fetch: Callable[[], Awaitable[FetchedVersion]], slicer: Slicer) -> ReceiverRun:
    started = time.perf_counter()
    fetched = await fetch()
    await asyncio.to_thread(_trim_file, Path(fetched.path), slicer)
    return ReceiverRun(name, fetched.bytes_received, time.perf_counter() - started)


def _trim_file(path: Path, slicer: Slicer) -> dict[str, np.ndarray]:
    """Trim straight from a read-only map of the file (read faults of cached pages are cheap)."""
    if not path.stat().st_size:
        return slicer.trim(np.zeros(0, dtype=np.uint8))
    return slicer.trim(np.memmap(path, dtype=np.uint8, mode="r"))
