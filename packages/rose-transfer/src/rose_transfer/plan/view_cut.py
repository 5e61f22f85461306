"""``ViewCut``: how to cut each bucket of a shard view straight from the whole version's stream.

A publisher serving a view needs the view's bytes one bucket at a time (to checksum it, to encode
its patch, to send it dense), so it never has to hold the view as a stream of its own: each bucket
is cut into a buffer the caller reuses (pages already faulted in), in the few strided copies of its
``CopySegment``s clipped to the bucket (``receiver_segments`` over rows, never byte by byte)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rose_core.protocol.messages import BucketInfo, ShardView, TensorEntry, WeightManifest
from rose_transfer.plan.shard_plan import CopySegment, assemble, receiver_segments
from rose_transfer.plan.shard_view import view_entries
from rose_transfer.version.manifest import VersionHead, bucket_checksum, digested_manifest


@dataclass(slots=True, frozen=True)
class ViewCut:
    """The view's layout (``entries``, ``total`` bytes) and, per bucket of ``bucket_bytes``, the
    segments that fill it (destination offsets relative to the bucket) and its padding ranges."""

    view: ShardView
    entries: list[TensorEntry]
    total: int
    bucket_bytes: int
    segments: list[list[CopySegment]]
    padding: list[list[tuple[int, int]]]

    def bucket_count(self) -> int:
        return len(self.segments)

    def bucket_nbytes(self, index: int) -> int:
        return min(self.bucket_bytes, self.total - index * self.bucket_bytes)

    def cut(self, index: int, whole: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Bucket ``index`` of the view, cut from ``whole`` (the version's stream) into the start
        of ``out``; returns that part of ``out``."""
        target = out[: self.bucket_nbytes(index)]
        for start, end in self.padding[index]:
            target[start:end] = 0
        return assemble(self.segments[index], [whole], target)

    def runs(self, index: int, word_bytes: int) -> np.ndarray | None:
        """Bucket ``index`` as rows ``(src, dst, n)`` in words (``n`` words at word ``src`` of the whole
        stream land at word ``dst`` of the bucket), in bucket order: what a patch can be scanned from
        without cutting the bucket. None when a row is not whole words or rows interleave."""
        parts = []
        for segment in self.segments[index]:
            rows = np.arange(segment.count, dtype=np.int64)
            parts.append(
                np.stack(
                    [
                        segment.source_offset + rows * segment.source_stride,
                        segment.dest_offset + rows * segment.dest_stride,
                        np.full(segment.count, segment.nbytes, dtype=np.int64),
                    ],
                    axis=1,
                )
            )
        table = np.concatenate(parts) if parts else np.empty((0, 3), dtype=np.int64)
        table = table[table[:, 2] > 0]
        if (table % word_bytes).any() or self.bucket_nbytes(index) % word_bytes:
            return None
        table = table[np.argsort(table[:, 1], kind="stable")] // word_bytes
        if (table[1:, 1] < table[:-1, 1] + table[:-1, 2]).any():
            return None
        return table


def view_cut(whole: WeightManifest, view: ShardView) -> ViewCut:
    """The cut of ``view`` from versions laid out as ``whole``."""
    entries, total = view_entries(whole, view)
    plans = receiver_segments(whole.tensors, view.tp, view.rank)
    size = whole.bucket_bytes
    segments: list[list[CopySegment]] = []
    padding: list[list[tuple[int, int]]] = []
    for low in range(0, total, size):
        high = min(low + size, total)
        segments.append([part for e in entries for s in plans[e.name] for part in _clipped(s, e, low, high)])
        padding.append(_padding(entries, low, high))
    return ViewCut(view, entries, total, size, segments, padding)


def view_manifest(whole: WeightManifest, cut: ViewCut, stream: np.ndarray, scratch: np.ndarray) -> WeightManifest:
    """The manifest of the version ``whole`` (bytes ``stream``) as ``cut.view`` holds it: each bucket
    cut into ``scratch`` (at least one bucket long) and checksummed there."""
    buckets = []
    for index in range(cut.bucket_count()):
        data = cut.cut(index, stream, scratch)
        buckets.append(
            BucketInfo(index=index, offset=index * cut.bucket_bytes, nbytes=data.nbytes, checksum=bucket_checksum(data))
        )
    head = VersionHead(whole.version, whole.bucket_bytes, whole.base_version, cut.view, whole.digest)
    return digested_manifest(head, cut.entries, cut.total, buckets)


def _padding(entries: list[TensorEntry], low: int, high: int) -> list[tuple[int, int]]:
    """The ranges of ``[low, high)`` that no tensor covers (alignment padding), relative to ``low``."""
    gaps, end = [], 0
    for entry in (*entries, None):
        start = high if entry is None else entry.offset
        lo, hi = max(end, low), min(start, high)
        if lo < hi:
            gaps.append((lo - low, hi - low))
        if entry is not None:
            end = entry.offset + entry.nbytes
    return gaps


def _clipped(segment: CopySegment, entry: TensorEntry, low: int, high: int) -> list[CopySegment]:
    """The parts of ``segment`` (of local tensor ``entry``) that write view bytes ``[low, high)``,
    with destination offsets relative to ``low``: the rows inside whole, the edge rows cut."""
    n, stride, first_dest = segment.nbytes, segment.dest_stride, entry.offset + segment.dest_offset
    if n == 0 or segment.count == 0:
        return []
    first = max(0, (low - first_dest - n) // stride + 1)  # first row ending after ``low``
    last = min(segment.count - 1, (high - 1 - first_dest) // stride)  # last row starting before ``high``
    if first > last:
        return []
    whole_from = first if first_dest + first * stride >= low else first + 1
    whole_to = last if first_dest + last * stride + n <= high else last - 1
    parts = []
    if whole_from > first:
        parts.append(_row_part(segment, first, first_dest, low, high))
    if whole_from <= whole_to:
        parts.append(
            CopySegment(
                segment.source,
                whole_to - whole_from + 1,
                segment.source_offset + whole_from * segment.source_stride,
                segment.source_stride,
                first_dest + whole_from * stride - low,
                stride,
                n,
            )
        )
    if whole_to < last and not (last == first and whole_from > first):
        parts.append(_row_part(segment, last, first_dest, low, high))
    return parts


def _row_part(segment: CopySegment, row: int, first_dest: int, low: int, high: int) -> CopySegment:
    """The part of row ``row`` of ``segment`` inside view bytes ``[low, high)``, relative to ``low``."""
    start = first_dest + row * segment.dest_stride
    lo, hi = max(start, low), min(start + segment.nbytes, high)
    source = segment.source_offset + row * segment.source_stride + (lo - start)
    return CopySegment(segment.source, 1, source, hi - lo, lo - low, hi - lo, hi - lo)
