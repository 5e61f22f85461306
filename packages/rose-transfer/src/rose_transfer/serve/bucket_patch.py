"""The publisher's sparse reply: one bucket of a new version encoded against the version a receiver
holds (``codec.bucket_codec.encode_bucket``: new values at changed positions, or dense when that is smaller)."""

from __future__ import annotations

import numpy as np

from rose_core.messages import BucketData
from rose_transfer.codec.bucket_codec import encode_bucket
from rose_transfer.version.dtypes import storage_dtype
from rose_transfer.version.manifest import FlatVersion


def same_buckets(base: FlatVersion, new: FlatVersion) -> bool:
    """Whether ``base`` is cut into the same buckets as ``new`` (a patch needs byte-aligned buckets)."""
    old, cur = base.manifest, new.manifest
    return (
        old.total_bytes == cur.total_bytes
        and old.bucket_bytes == cur.bucket_bytes
        and len(old.buckets) == len(cur.buckets)
    )


def word_bytes(new: FlatVersion) -> int:
    """The compare width: the narrowest element size of the version (2 for bf16/fp16), capped to 4."""
    sizes = {storage_dtype(t.dtype).itemsize for t in new.manifest.tensors if t.nbytes}
    return min(min(sizes, default=1), 4)


def patch_reply(base: FlatVersion, new: FlatVersion, index: int) -> BucketData:
    """Bucket ``index`` of ``new`` for a receiver holding ``base``; ``checksum`` is of the NEW bucket."""
    encoded = encode_bucket(base.bucket(index), new.bucket(index), word_bytes=word_bytes(new))
    payload = encoded.payload if isinstance(encoded.payload, np.ndarray) else np.frombuffer(encoded.payload, np.uint8)
    return BucketData(
        version=new.manifest.version,
        index=index,
        encoding=encoded.encoding,
        checksum=new.manifest.buckets[index].checksum,
        data=payload,
    )
