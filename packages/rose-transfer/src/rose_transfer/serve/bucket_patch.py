"""The publisher's bucket replies: one bucket of a new version encoded against the version a receiver
holds (new values at changed positions, or dense when that is smaller), or dense. A shard view's patch
is scanned straight from the two whole streams, row by row (``codec.patch_encoder.build_patch_runs``),
when both versions cut the bucket alike; otherwise its buckets are cut into this worker thread's
scratch buffers first."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rose_core.protocol.messages import BucketData, WeightManifest
from rose_transfer.codec.bucket_codec import DENSE, PATCH, encode_bucket
from rose_transfer.codec.patch_encoder import build_patch_runs, prepare
from rose_transfer.serve.scratch import scratch
from rose_transfer.serve.served_view import ServedView
from rose_transfer.version.dtypes import storage_dtype


def same_buckets(base: WeightManifest, new: WeightManifest) -> bool:
    """Whether ``base`` is cut into the same buckets as ``new`` (a patch needs byte-aligned buckets)."""
    return (
        base.total_bytes == new.total_bytes
        and base.bucket_bytes == new.bucket_bytes
        and len(base.buckets) == len(new.buckets)
    )


def word_bytes(new: WeightManifest) -> int:
    """The compare width: the narrowest element size of the version (2 for bf16/fp16), capped to 4."""
    sizes = {storage_dtype(t.dtype).itemsize for t in new.tensors if t.nbytes}
    return min(min(sizes, default=1), 4)


def prepare_thread(bucket_bytes: int, word_bytes: int) -> None:
    """Ready this worker thread for patches of buckets of ``bucket_bytes``: the encoder's buffers and the
    scratch pair (a view's bucket is cut into it for its manifest, and on the fallback path), faulted in."""
    prepare(bucket_bytes, word_bytes)
    scratch(0, bucket_bytes)


def patch_reply(base: ServedView, new: ServedView, index: int, allocate: Callable[[int], np.ndarray]) -> BucketData:
    """Bucket ``index`` of ``new`` for a receiver holding ``base``; ``checksum`` is of the NEW bucket."""
    nbytes, width = new.manifest.buckets[index].nbytes, word_bytes(new.manifest)
    runs = _shared_runs(base, new, index, width)
    if runs is not None:
        patch = build_patch_runs(base.whole.stream, new.whole.stream, runs, nbytes, width)
        return dense_reply(new, index, allocate) if patch is None else _reply(new, index, PATCH, patch)
    old, cur = base.bucket(index, scratch(0, nbytes)), new.bucket(index, scratch(1, nbytes))
    encoded = encode_bucket(old, cur, word_bytes=width)
    if encoded.encoding == DENSE:  # the patch is not smaller: send the bucket itself, not the scratch
        return dense_reply(new, index, allocate)
    payload = encoded.payload if isinstance(encoded.payload, np.ndarray) else np.frombuffer(encoded.payload, np.uint8)
    return _reply(new, index, encoded.encoding, payload)


def _shared_runs(base: ServedView, new: ServedView, index: int, width: int) -> np.ndarray | None:
    """The rows of bucket ``index`` in both versions' streams, when the two views cut it alike."""
    if base.cut is None or new.cut is None or base.cut.segments[index] != new.cut.segments[index]:
        return None
    if base.whole.stream.nbytes != new.whole.stream.nbytes:
        return None
    return new.cut.runs(index, width)


def dense_reply(new: ServedView, index: int, allocate: Callable[[int], np.ndarray]) -> BucketData:
    """Bucket ``index`` of ``new`` as it is (a whole version's: a slice of its stream, no copy)."""
    return _reply(new, index, DENSE, new.owned_bucket(index, allocate))


def _reply(new: ServedView, index: int, encoding: str, data: np.ndarray) -> BucketData:
    manifest = new.manifest
    return BucketData(
        version=manifest.version, index=index, encoding=encoding, checksum=manifest.buckets[index].checksum, data=data
    )
