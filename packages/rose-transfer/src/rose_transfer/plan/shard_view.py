"""A weight version as one shard holds it: rank ``r`` of tensor-parallel degree ``t`` keeps only its
slice of every tensor, each laid out as its engine's local tensor, in a stream of its own.

The publisher cuts this view from the whole version once per (version, view) it is asked for and
serves it like any version: buckets, checksums, patches against the same view of the version the
receiver holds. A receiver then moves, patches and checksums only its shard's bytes, and what it
holds is its engine's weights (``tensor_views`` of it are the local tensors): nothing to trim."""

from __future__ import annotations

import math

import numpy as np

from rose_core.errors import RoseError
from rose_core.messages import ShardView, TensorEntry
from rose_transfer.plan.shard_plan import assemble, receiver_segments
from rose_transfer.plan.shard_spec import ShardSpec, local_shape
from rose_transfer.version.dtypes import storage_dtype
from rose_transfer.version.manifest import FlatVersion, align_offset, build_version


def check_view(view: ShardView | None) -> None:
    if view is not None and not (view.tp >= 1 and 0 <= view.rank < view.tp):
        raise RoseError(f"a shard view is rank 0..tp-1 of tp >= 1, got rank {view.rank} of tp {view.tp}")


def view_version(whole: FlatVersion, view: ShardView) -> FlatVersion:
    """The version ``whole`` as ``view`` holds it."""
    check_view(view)
    manifest = whole.manifest
    plans = receiver_segments(manifest.tensors, view.tp, view.rank)
    entries, offset = [], 0
    for entry in manifest.tensors:
        shape = list(local_shape(ShardSpec.parse(entry.shard), entry.shape, view.tp, view.rank))
        nbytes = math.prod(shape) * storage_dtype(entry.dtype).itemsize
        offset = align_offset(offset)
        entries.append(TensorEntry(name=entry.name, dtype=entry.dtype, shape=shape, offset=offset, nbytes=nbytes))
        offset += nbytes

    def fill(local: TensorEntry, region: np.ndarray) -> None:
        assemble(plans[local.name], [whole.stream], region)

    return build_version(
        entries,
        offset,
        fill,
        version=manifest.version,
        bucket_bytes=manifest.bucket_bytes,
        base_version=manifest.base_version,
        view=view,
        source_digest=manifest.digest,
    )
