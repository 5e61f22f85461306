"""``AssemblyPlan``: how the local shards of a tensor-parallel group fill one whole weight version.

Each rank of a group of ``ranks`` offers its local tensors (``TensorEntry``s with local shapes and the
shard spec text). ``assembly_plan`` checks that the offers agree (the same tensors, specs and dtypes on
every rank, each local shape exactly what its spec gives that rank of the whole shape), lays out the
whole version exactly as ``flatten`` lays out the full state dict (rank 0's tensor order, the same
alignment and shard texts), and maps every byte of it to the one rank and local offset it comes from
(``plan_tensor`` from ``ranks`` sources to one destination: a replicated tensor, or a KV head
replicated over ranks, is read from its lowest rank only). Every byte of the stream is written exactly
once (padding by ``zero_padding``), so the assembled stream, its bucket checksums and its manifest
digest are those of ``flatten`` of the full tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from rose_core.protocol.messages import TensorEntry
from rose_core.support.errors import RoseError
from rose_transfer.plan.shard_plan import CopySegment, assemble, plan_tensor
from rose_transfer.plan.shard_spec import ShardSpec, local_shape
from rose_transfer.version.dtypes import storage_dtype
from rose_transfer.version.manifest import (
    FlatVersion,
    VersionHead,
    align_offset,
    digested_manifest,
    plan_buckets,
)


@dataclass(slots=True, frozen=True)
class AssemblyPlan:
    """The whole version's layout and, per rank and tensor, the segments (``source`` 0: that rank's
    local tensor; destination offsets absolute in the whole stream) its local bytes fill."""

    ranks: int
    entries: list[TensorEntry]
    total: int
    local_nbytes: dict[int, dict[str, int]]
    segments: dict[int, dict[str, list[CopySegment]]]

    def sends(self, rank: int) -> list[str]:
        """The tensors whose local bytes ``rank`` sends, in layout order (those it fills at least one byte of)."""
        return [e.name for e in self.entries if self.segments[rank].get(e.name)]

    def fill(self, rank: int, name: str, local: np.ndarray, stream: np.ndarray) -> None:
        """Write ``rank``'s part of ``name`` from ``local`` (its local tensor's bytes, uint8) into ``stream``."""
        if local.nbytes != self.local_nbytes[rank][name]:
            raise RoseError(f"{name}: rank {rank} sent {local.nbytes} bytes of its {self.local_nbytes[rank][name]}")
        assemble(self.segments[rank][name], [local], stream)

    def zero_padding(self, stream: np.ndarray) -> None:
        """Zero the alignment gaps between tensors (the only bytes no rank writes)."""
        end = 0
        for entry in self.entries:
            stream[end : entry.offset] = 0
            end = entry.offset + entry.nbytes
        stream[end : self.total] = 0

    def version(self, stream: np.ndarray, *, version: int, bucket_bytes: int) -> FlatVersion:
        """The filled ``stream`` as a version: checksummed buckets and a digested manifest."""
        buckets = plan_buckets(stream, bucket_bytes)
        manifest = digested_manifest(VersionHead(version, bucket_bytes), self.entries, self.total, buckets)
        return FlatVersion(manifest=manifest, stream=stream)


def assembly_plan(offers: Mapping[int, Sequence[TensorEntry]], ranks: int) -> AssemblyPlan:
    """The plan of one version from the offers of ranks ``0..ranks-1``; ``RoseError`` naming the fix if
    they disagree with each other or with their specs."""
    missing = [rank for rank in range(ranks) if rank not in offers]
    if missing:
        raise RoseError(f"ranks {missing} of {ranks} have not offered: every rank of the group publishes its shard")
    by_rank = {rank: _by_name(rank, offers[rank]) for rank in range(ranks)}
    _check_same_names(by_rank)
    entries: list[TensorEntry] = []
    offset = 0
    segments: dict[int, dict[str, list[CopySegment]]] = {rank: {} for rank in range(ranks)}
    for first in offers[0]:
        locals_ = [by_rank[rank][first.name] for rank in range(ranks)]
        spec, dtype = _agreed_spec(locals_), _agreed_dtype(locals_)
        shape = whole_shape(spec, [e.shape for e in locals_], first.name)
        itemsize = storage_dtype(dtype).itemsize
        offset = align_offset(offset)
        entry = TensorEntry(
            name=first.name, dtype=dtype, shape=shape, offset=offset, nbytes=math.prod(shape) * itemsize,
            shard=first.shard,
        )
        entries.append(entry)
        offset += entry.nbytes
        for segment in plan_tensor(spec, shape, itemsize, ranks, 1, 0, first.name):
            moved = replace(segment, source=0, dest_offset=segment.dest_offset + entry.offset)
            segments[segment.source].setdefault(first.name, []).append(moved)
    local_nbytes = {rank: {name: e.nbytes for name, e in by_rank[rank].items()} for rank in range(ranks)}
    return AssemblyPlan(ranks, entries, offset, local_nbytes, segments)


def whole_shape(spec: ShardSpec, local_shapes: Sequence[Sequence[int]], name: str = "tensor") -> list[int]:
    """The full shape whose shards over ``len(local_shapes)`` ranks are ``local_shapes``, or ``RoseError``.

    Along the shard dim the whole is the sum of the spec's sections if it lists them, the sum of the
    local rows for a vocab split (ranks hold disjoint real rows), else local size x ranks."""
    ranks, first = len(local_shapes), list(local_shapes[0])
    if not spec.sharded:
        if any(list(s) != first for s in local_shapes):
            raise RoseError(
                f"{name} is replicated but its ranks hold shapes {[list(s) for s in local_shapes]}: "
                "give it a shard spec, or publish the same tensor on every rank"
            )
        return first
    if not 0 <= spec.dim < len(first):
        raise RoseError(f"{name} of local shape {first} has no dimension {spec.dim} to shard ({spec.to_text()})")
    if spec.sections:
        size = sum(section.size for section in spec.sections)
    elif spec.kind == "vocab":
        size = sum(s[spec.dim] for s in local_shapes if len(s) > spec.dim)
    else:
        size = first[spec.dim] * ranks
    whole = [*first[: spec.dim], size, *first[spec.dim + 1 :]]
    for rank, shape in enumerate(local_shapes):
        want = list(local_shape(spec, whole, ranks, rank))
        if list(shape) != want:
            raise RoseError(
                f"{name}: rank {rank} holds shape {list(shape)}, but a {spec.to_text()!r} shard of {whole} "
                f"on rank {rank} of {ranks} is {want}: fix the shard spec or pass that rank's own shard"
            )
    return whole


def _by_name(rank: int, entries: Sequence[TensorEntry]) -> dict[str, TensorEntry]:
    named: dict[str, TensorEntry] = {}
    for entry in entries:
        if entry.name in named:
            raise RoseError(f"rank {rank} offers {entry.name!r} twice: publish each tensor once")
        itemsize = storage_dtype(entry.dtype).itemsize
        if min(entry.shape, default=0) < 0 or math.prod(entry.shape) * itemsize != entry.nbytes:
            raise RoseError(f"rank {rank} offers {entry.name!r} with {entry.nbytes} bytes for shape {entry.shape}")
        named[entry.name] = entry
    return named


def _check_same_names(by_rank: Mapping[int, Mapping[str, TensorEntry]]) -> None:
    names = set(by_rank[0])
    for rank, named in by_rank.items():
        extra, lacking = sorted(set(named) - names), sorted(names - set(named))
        if extra or lacking:
            raise RoseError(
                f"rank {rank} offers {extra} that rank 0 does not and lacks {lacking}: every rank publishes "
                "every tensor (its shard, or the whole of a replicated one)"
            )


def _agreed_spec(entries: Sequence[TensorEntry]) -> ShardSpec:
    specs = [ShardSpec.parse(entry.shard) for entry in entries]
    for rank, spec in enumerate(specs):
        if spec != specs[0]:
            raise RoseError(
                f"{entries[0].name} is sharded {entries[0].shard!r} on rank 0 but {entries[rank].shard!r} on "
                f"rank {rank}: pass the same specs on every rank"
            )
    return specs[0]


def _agreed_dtype(entries: Sequence[TensorEntry]) -> str:
    dtypes = [entry.dtype for entry in entries]
    if len(set(dtypes)) != 1:
        raise RoseError(f"{entries[0].name} has dtypes {dtypes} on ranks 0..{len(dtypes) - 1}: cast every shard alike")
    return dtypes[0]
