"""Single-core speed of the sparse codec on a real version pair: every bucket encoded against the
previous version and decoded back (GB/s of model bytes), plus the patch size of each bucket."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from rose_core.protocol.messages import WeightManifest
from rose_transfer.codec.bucket_codec import decode_bucket, encode_bucket
from rose_transfer.version.dtypes import storage_dtype


@dataclass(slots=True)
class CodecSpeed:
    encode_gbps: float
    decode_gbps: float
    changed_fraction: float
    wire_bytes: dict[int, int] = field(default_factory=dict)
    exact: bool = True


def codec_speed(old: np.ndarray, new: np.ndarray, manifest: WeightManifest) -> CodecSpeed:
    word = min((storage_dtype(t.dtype).itemsize for t in manifest.tensors if t.nbytes), default=1)
    word = min(word, 4)
    encoded, encode_s = [], 0.0
    for b in manifest.buckets:
        started = time.perf_counter()
        encoded.append(
            encode_bucket(old[b.offset : b.offset + b.nbytes], new[b.offset : b.offset + b.nbytes], word_bytes=word)
        )
        encode_s += time.perf_counter() - started
    out = np.empty(manifest.bucket_bytes, dtype=np.uint8)
    out[:] = 0  # touched, so the decode timing has no page faults
    decode_s, exact = 0.0, True
    for b, enc in zip(manifest.buckets, encoded, strict=True):
        target = out[: b.nbytes]
        started = time.perf_counter()
        decode_bucket(enc.encoding, enc.payload, old[b.offset : b.offset + b.nbytes], out=target)
        decode_s += time.perf_counter() - started
        exact = exact and np.array_equal(target, new[b.offset : b.offset + b.nbytes])
    return CodecSpeed(
        encode_gbps=new.nbytes / encode_s / 1e9,
        decode_gbps=new.nbytes / decode_s / 1e9,
        changed_fraction=_changed_fraction(old, new, word),
        wire_bytes={b.index: e.wire_bytes for b, e in zip(manifest.buckets, encoded, strict=True)},
        exact=exact,
    )


def _changed_fraction(old: np.ndarray, new: np.ndarray, word: int) -> float:
    usable = old.nbytes // word * word
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[word]
    changed = 0
    step = 1 << 24
    for start in range(0, usable, step):
        end = min(start + step, usable)
        changed += int(np.count_nonzero(old[start:end].view(dtype) != new[start:end].view(dtype)))
    return changed / max(usable // word, 1)
