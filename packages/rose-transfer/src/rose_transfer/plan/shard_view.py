"""A weight version as one shard holds it: rank ``r`` of tensor-parallel degree ``t`` keeps only its
slice of every tensor, each laid out as its engine's local tensor, in a stream of its own.

The publisher serves a view like any version (buckets, checksums, patches against the same view of
the version the receiver holds), cutting each bucket from the whole stream when it needs its bytes
(``view_cut``); ``view_version`` cuts the whole view into a stream of its own. A receiver then
moves, patches and checksums only its shard's bytes, and what it holds is its engine's weights
(``tensor_views`` of it are the local tensors): nothing to trim."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rose_core.protocol.messages import ShardView, TensorEntry, WeightManifest
from rose_core.support.errors import RoseError
from rose_transfer.plan.shard_plan import assemble, receiver_segments
from rose_transfer.plan.shard_spec import ShardSpec, local_shape
from rose_transfer.version.dtypes import storage_dtype
from rose_transfer.version.host_buffer import host_buffer
from rose_transfer.version.manifest import FlatVersion, align_offset, build_version


def check_view(view: ShardView | None) -> None:
    if view is not None and not (view.tp >= 1 and 0 <= view.rank < view.tp):
        raise RoseError(f"a shard view is rank 0..tp-1 of tp >= 1, got rank {view.rank} of tp {view.tp}")


def view_entries(whole: WeightManifest, view: ShardView) -> tuple[list[TensorEntry], int]:
    """The local tensors of ``view`` (entries of its own stream, aligned like a version's) and that
    stream's length."""
    check_view(view)
    entries, offset = [], 0
    for entry in whole.tensors:
        shape = list(local_shape(ShardSpec.parse(entry.shard), entry.shape, view.tp, view.rank))
        nbytes = math.prod(shape) * storage_dtype(entry.dtype).itemsize
        offset = align_offset(offset)
        entries.append(TensorEntry(name=entry.name, dtype=entry.dtype, shape=shape, offset=offset, nbytes=nbytes))
        offset += nbytes
    return entries, offset


def view_version(
    whole: FlatVersion, view: ShardView, allocate: Callable[[int], np.ndarray] = host_buffer
) -> FlatVersion:
    """The version ``whole`` as ``view`` holds it, in a stream of its own (from ``allocate``)."""
    manifest = whole.manifest
    plans = receiver_segments(manifest.tensors, view.tp, view.rank)
    entries, total = view_entries(manifest, view)

    def fill(local: TensorEntry, region: np.ndarray) -> None:
        assemble(plans[local.name], [whole.stream], region)

    return build_version(
        entries,
        total,
        fill,
        version=manifest.version,
        bucket_bytes=manifest.bucket_bytes,
        base_version=manifest.base_version,
        view=view,
        source_digest=manifest.digest,
        allocate=allocate,
    )
