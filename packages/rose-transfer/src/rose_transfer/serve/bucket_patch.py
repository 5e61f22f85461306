"""The publisher's bucket replies: one bucket of a new version encoded against the version a receiver
holds (``codec.bucket_codec.encode_bucket``: new values at changed positions, or dense when that is
smaller), or dense. A shard view's buckets are cut into this worker thread's scratch buffers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rose_core.messages import BucketData, WeightManifest
from rose_transfer.codec.bucket_codec import DENSE, encode_bucket
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


def patch_reply(base: ServedView, new: ServedView, index: int, allocate: Callable[[int], np.ndarray]) -> BucketData:
    """Bucket ``index`` of ``new`` for a receiver holding ``base``; ``checksum`` is of the NEW bucket."""
    nbytes = new.manifest.buckets[index].nbytes
    old, cur = base.bucket(index, scratch(0, nbytes)), new.bucket(index, scratch(1, nbytes))
    encoded = encode_bucket(old, cur, word_bytes=word_bytes(new.manifest))
    if encoded.encoding == DENSE:  # the patch is not smaller: send the bucket itself, not the scratch
        return dense_reply(new, index, allocate)
    payload = encoded.payload if isinstance(encoded.payload, np.ndarray) else np.frombuffer(encoded.payload, np.uint8)
    return _reply(new, index, encoded.encoding, payload)


def dense_reply(new: ServedView, index: int, allocate: Callable[[int], np.ndarray]) -> BucketData:
    """Bucket ``index`` of ``new`` as it is (a whole version's: a slice of its stream, no copy)."""
    return _reply(new, index, DENSE, new.owned_bucket(index, allocate))


def _reply(new: ServedView, index: int, encoding: str, data: np.ndarray) -> BucketData:
    manifest = new.manifest
    return BucketData(
        version=manifest.version, index=index, encoding=encoding, checksum=manifest.buckets[index].checksum, data=data
    )
