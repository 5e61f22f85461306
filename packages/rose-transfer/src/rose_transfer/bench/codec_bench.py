"""Benchmark of the sparse codec against the naive numpy patch, in the same run, on one core.

Model bytes per second: a ``size_bytes`` buffer of bf16 (or fp16/fp32) bits with ``changed`` of its
elements changed, encoded bucket by bucket as the publisher would, decoded into a fresh buffer as a
receiver would. The naive path is ``flatnonzero(old != new)`` + gather, and copy + scatter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from rose_transfer.codec.bucket_codec import EncodedBucket, decode_bucket, encode_bucket
from rose_transfer.version.host_buffer import host_buffer
from rose_transfer.version.manifest import DEFAULT_BUCKET_BYTES

WORDS: dict[str, type[np.unsignedinteger[Any]]] = {"bfloat16": np.uint16, "float16": np.uint16, "float32": np.uint32}


@dataclass(slots=True)
class CodecBenchResult:
    size_bytes: int
    dtype: str
    changed: float
    bucket_bytes: int
    wire_bytes: int = 0
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def gbps(self, name: str, pick: str = "best") -> float:
        times = self.seconds[name]
        return self.size_bytes / (min(times) if pick == "best" else times[0]) / 1e9

    def as_dict(self) -> dict[str, Any]:
        rates = {f"{name}_gbps": {"first": self.gbps(name, "first"), "best": self.gbps(name)} for name in self.seconds}
        return {
            "size_bytes": self.size_bytes,
            "dtype": self.dtype,
            "changed": self.changed,
            "bucket_bytes": self.bucket_bytes,
            "wire_bytes": self.wire_bytes,
            **rates,
        }


def run_codec_bench(
    size_bytes: int = 300_000_000,
    dtype: str = "bfloat16",
    changed: float = 0.01,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    runs: int = 3,
) -> CodecBenchResult:
    old, new = _buffers(size_bytes, dtype, changed)
    word_bytes = np.dtype(WORDS[dtype]).itemsize
    result = CodecBenchResult(old.nbytes, dtype, changed, bucket_bytes)
    old_words, new_words = old.view(WORDS[dtype]), new.view(WORDS[dtype])
    for _ in range(runs):
        positions, values = _timed(result, "naive_encode", partial(_naive_encode, old_words, new_words))
        _timed(result, "naive_decode", partial(_naive_decode, old_words, positions, values))
        encoded = _timed(result, "encode", partial(_encode_all, old, new, bucket_bytes, word_bytes))
        decoded = _timed(result, "decode", partial(_decode_all, encoded, old, bucket_bytes))
        if decoded.tobytes() != new.tobytes():
            raise RuntimeError("the codec benchmark decoded different bytes: report this bug")
    result.wire_bytes = sum(e.wire_bytes for e in encoded)
    return result


def _buffers(size_bytes: int, dtype: str, changed: float) -> tuple[np.ndarray, np.ndarray]:
    word = np.dtype(WORDS[dtype])
    rng = np.random.default_rng(0)
    count = size_bytes // word.itemsize
    old = rng.integers(0, 1 << (8 * word.itemsize), count, dtype=np.int64).astype(word)
    new = old.copy()
    where = rng.choice(count, int(count * changed), replace=False)
    new[where] ^= rng.integers(1, 256, where.size).astype(word)
    return old.view(np.uint8), new.view(np.uint8)


def _timed(result: CodecBenchResult, name: str, work: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    value = work()
    result.seconds.setdefault(name, []).append(time.perf_counter() - started)
    return value


def _naive_encode(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    positions = np.flatnonzero(old != new)
    return positions, new[positions]


def _naive_decode(old: np.ndarray, positions: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = old.copy()
    out[positions] = values
    return out


def _encode_all(old: np.ndarray, new: np.ndarray, bucket_bytes: int, word_bytes: int) -> list[EncodedBucket]:
    windows = [slice(start, start + bucket_bytes) for start in range(0, old.nbytes, bucket_bytes)]
    return [encode_bucket(old[w], new[w], word_bytes=word_bytes) for w in windows]


def _decode_all(encoded: list[EncodedBucket], old: np.ndarray, bucket_bytes: int) -> np.ndarray:
    out = host_buffer(old.nbytes)
    for index, bucket in enumerate(encoded):
        start = index * bucket_bytes
        window = slice(start, start + bucket_bytes)
        decode_bucket(bucket.encoding, bucket.payload, old[window], out=out[window])
    return out
