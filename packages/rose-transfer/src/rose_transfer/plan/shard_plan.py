"""Which bytes a receiver needs, and from where: copy segments between differently sharded layouts.

A trainer with tensor-parallel degree ``s`` holds each sharded tensor as ``s`` local shards; a
rollout engine rank ``r`` of degree ``d`` needs its own slice (see ``shard_spec``). ``plan_tensor``
maps every piece of that slice to the source rank and the byte offsets it comes from, as
``CopySegment``s: ``count`` equal copies of ``nbytes`` at a fixed stride (one per row of the
dimensions before the shard dimension), never listing bytes one by one. Every destination byte is
covered exactly once, and only bytes of the receiver's slice are planned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rose_core.protocol.messages import TensorEntry, WeightManifest
from rose_transfer.plan.shard_spec import ShardSpec, rank_intervals
from rose_transfer.version.dtypes import storage_dtype


@dataclass(slots=True, frozen=True)
class CopySegment:
    """For ``i`` in ``range(count)``: copy ``nbytes`` from source ``source`` at ``source_offset +
    i * source_stride`` to ``dest_offset + i * dest_stride`` of the receiver's local tensor."""

    source: int
    count: int
    source_offset: int
    source_stride: int
    dest_offset: int
    dest_stride: int
    nbytes: int

    @property
    def total_bytes(self) -> int:
        return self.count * self.nbytes

    def source_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """Start offsets and lengths (int64) of the source byte ranges this segment reads."""
        starts = self.source_offset + np.arange(self.count, dtype=np.int64) * self.source_stride
        return starts, np.full(self.count, self.nbytes, dtype=np.int64)


def _segment(source: int, count: int, src: int, src_stride: int, dst: int, dst_stride: int, n: int) -> CopySegment:
    if count > 1 and src_stride == n and dst_stride == n:  # contiguous on both sides: one copy
        return CopySegment(source, 1, src, n * count, dst, n * count, n * count)
    return CopySegment(source, count, src, src_stride, dst, dst_stride, n)


def plan_tensor(
    spec: ShardSpec,
    shape: Sequence[int],
    itemsize: int,
    source_ranks: int,
    dest_ranks: int,
    dest_rank: int,
    name: str = "tensor",
) -> list[CopySegment]:
    """Segments that build ``dest_rank``'s local tensor from the local shards of ``source_ranks``."""
    shape = tuple(shape)
    if not spec.sharded:
        nbytes = math.prod(shape) * itemsize
        return [_segment(dest_rank % source_ranks, 1, 0, nbytes, 0, nbytes, nbytes)] if nbytes else []
    outer = math.prod(shape[: spec.dim])
    inner = math.prod(shape[spec.dim + 1 :]) * itemsize
    dest = _located(rank_intervals(spec, shape, dest_ranks, dest_rank, name))
    dest_size = sum(end - start for start, end, _ in dest)
    segments = []
    for start, end, dest_at in dest:
        for src_start, src_end, source, src_at, src_size in _sources(spec, shape, source_ranks, dest_rank, name):
            low, high = max(start, src_start), min(end, src_end)
            if low >= high or outer == 0 or inner == 0:
                continue
            segments.append(
                _segment(
                    source,
                    outer,
                    (src_at + low - src_start) * inner,
                    src_size * inner,
                    (dest_at + low - start) * inner,
                    dest_size * inner,
                    (high - low) * inner,
                )
            )
    return segments


def _located(intervals: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Each interval with where it starts in the local tensor (along the shard dim)."""
    located, at = [], 0
    for start, end in intervals:
        located.append((start, end, at))
        at += end - start
    return located


def _sources(
    spec: ShardSpec, shape: tuple[int, ...], ranks: int, dest_rank: int, name: str
) -> list[tuple[int, int, int, int, int]]:
    """Distinct source intervals ``(start, end, rank, local start, local size)``. Replicated heads are
    held by several source ranks; each is read from one of them, chosen to spread receivers."""
    chosen: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
    for offset in range(ranks):
        rank = (dest_rank + offset) % ranks
        intervals = _located(rank_intervals(spec, shape, ranks, rank, name))
        size = sum(end - start for start, end, _ in intervals)
        for start, end, at in intervals:
            chosen.setdefault((start, end), (start, end, rank, at, size))
    return list(chosen.values())


def receiver_segments(
    entries: Sequence[TensorEntry],
    dest_ranks: int,
    dest_rank: int,
    specs: Mapping[str, ShardSpec] | None = None,
) -> dict[str, list[CopySegment]]:
    """For each tensor of a published (unsharded) version: the segments of the flat stream that rank
    ``dest_rank`` of ``dest_ranks`` needs. Specs come from ``specs`` or each entry's ``shard`` text."""
    plans = {}
    for entry in entries:
        spec = (specs or {}).get(entry.name) or ShardSpec.parse(entry.shard)
        itemsize = storage_dtype(entry.dtype).itemsize
        segments = plan_tensor(spec, entry.shape, itemsize, 1, dest_ranks, dest_rank, entry.name)
        plans[entry.name] = [_shifted(s, entry.offset) for s in segments]
    return plans


def _shifted(segment: CopySegment, offset: int) -> CopySegment:
    return CopySegment(
        segment.source,
        segment.count,
        segment.source_offset + offset,
        segment.source_stride,
        segment.dest_offset,
        segment.dest_stride,
        segment.nbytes,
    )


def needed_buckets(manifest: WeightManifest, segments: Mapping[str, Sequence[CopySegment]]) -> list[int]:
    """Indices of the buckets of ``manifest`` that hold at least one byte the segments read."""
    bounds = np.array([b.offset for b in manifest.buckets], dtype=np.int64)
    coverage = np.zeros(len(manifest.buckets) + 1, dtype=np.int64)  # +1 where a range starts, -1 after it ends
    for plan in segments.values():
        for segment in plan:
            starts, lengths = segment.source_ranges()
            np.add.at(coverage, np.searchsorted(bounds, starts, side="right") - 1, 1)
            np.add.at(coverage, np.searchsorted(bounds, starts + lengths - 1, side="right"), -1)
    return [int(i) for i in np.flatnonzero(np.cumsum(coverage[:-1]) > 0)]


def assemble(segments: Sequence[CopySegment], sources: Sequence[np.ndarray], out: np.ndarray) -> np.ndarray:
    """Run ``segments``: copy from ``sources[segment.source]`` (uint8 buffers) into ``out`` (uint8)."""
    for segment in segments:
        src = _strided(sources[segment.source], segment.source_offset, segment.source_stride, segment)
        dst = _strided(out, segment.dest_offset, segment.dest_stride, segment)
        dst[...] = src
    return out


def _strided(buffer: np.ndarray, offset: int, stride: int, segment: CopySegment) -> np.ndarray:
    flat = buffer.reshape(-1).view(np.uint8)
    end = offset + (segment.count - 1) * stride + segment.nbytes
    if offset < 0 or end > flat.size:
        raise ValueError(f"segment [{offset}, {end}) is outside a buffer of {flat.size} bytes")
    return np.lib.stride_tricks.as_strided(
        flat[offset:], shape=(segment.count, segment.nbytes), strides=(stride, 1), writeable=flat.flags.writeable
    )
