"""The sparse bucket codec: how one bucket travels to a receiver holding a base version.

- ``dense``: the bucket's bytes as they are (also what receivers without the base get);
- ``patch``: the NEW values at the positions that changed (``sparse_patch``), never additive deltas:
  the receiver overwrites its copy of the base, so the result is bit-exact (bf16 deltas drift).

The patch is chosen only when smaller than the dense bucket. ``+zstd`` marks a payload compressed
with zstandard (the ``[zstd]`` extra), kept only when that saves bytes. Words are compared as
integers of the tensors' element width (2 for bf16/fp16, 4 for fp32), so NaN payloads and -0.0 are
exact too. The encoder's scan is compiled (``patch_encoder``); decoding is vectorized numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rose_core.support.errors import require_extra
from rose_transfer.codec.patch_encoder import build_patch
from rose_transfer.codec.sparse_patch import PatchError, apply_patch
from rose_transfer.codec.words import WORD_DTYPES

DENSE = "dense"
PATCH = "patch"
ZSTD_SUFFIX = "+zstd"
_DECOMPRESS_SLACK = 1 << 20


class CodecError(ValueError):
    """A payload cannot be decoded against this base (corrupt, truncated, or for another bucket)."""


@dataclass(slots=True, frozen=True)
class EncodedBucket:
    encoding: str
    payload: Any  # a uint8 array, or bytes after zstd

    @property
    def wire_bytes(self) -> int:
        return memoryview(self.payload).nbytes


def encode_bucket(
    base: np.ndarray | None,
    new: np.ndarray,
    *,
    word_bytes: int = 2,
    compress: bool = False,
    zstd_level: int = 1,
) -> EncodedBucket:
    """The smallest lossless encoding of ``new`` for a receiver holding ``base`` (None: it holds none)."""
    if word_bytes not in WORD_DTYPES:
        raise ValueError(f"word_bytes must be one of {sorted(WORD_DTYPES)}, got {word_bytes}")
    new = _bytes_of(new)
    encoded = EncodedBucket(DENSE, new)
    if base is not None:
        base = _bytes_of(base)
        if base.nbytes != new.nbytes:
            raise ValueError(f"base bucket has {base.nbytes} bytes, the new one {new.nbytes}")
        patch = build_patch(base, new, word_bytes)
        if patch is not None:
            encoded = EncodedBucket(PATCH, patch)
    return _compressed(encoded, zstd_level) if compress else encoded


def decode_bucket(encoding: str, payload: Any, base: np.ndarray | None, out: np.ndarray | None = None) -> np.ndarray:
    """The bucket's new bytes (uint8), written into ``out`` if given (``out`` may be ``base`` itself).

    ``base`` is needed for patches only. Raises ``CodecError`` for a payload that does not fit."""
    kind = encoding.removesuffix(ZSTD_SUFFIX)
    if kind not in (DENSE, PATCH):
        raise CodecError(f"unknown bucket encoding {encoding!r}: install the same rose-transfer on both ends")
    if encoding.endswith(ZSTD_SUFFIX):
        data = _decompressed(payload, limit=(base.nbytes if base is not None else 0) + _DECOMPRESS_SLACK)
    else:
        data = np.frombuffer(payload, dtype=np.uint8)
    if kind == DENSE:
        return _dense_into(data, out)
    if base is None:
        raise CodecError("a patch needs the base version, and this receiver holds none")
    base = _bytes_of(base)
    target = out if out is not None else np.empty_like(base)
    try:
        apply_patch(data, base, _bytes_of(target))
    except PatchError as exc:
        raise CodecError(str(exc)) from exc
    return target


def unpack_payload(encoding: str, payload: Any, nbytes: int) -> tuple[str, np.ndarray]:
    """``(DENSE or PATCH, uint8 payload)`` of a bucket of ``nbytes``, decompressed if it was."""
    kind = encoding.removesuffix(ZSTD_SUFFIX)
    if kind not in (DENSE, PATCH):
        raise CodecError(f"unknown bucket encoding {encoding!r}: install the same rose-transfer on both ends")
    if encoding.endswith(ZSTD_SUFFIX):
        return kind, _decompressed(payload, limit=nbytes + _DECOMPRESS_SLACK)
    return kind, np.frombuffer(payload, dtype=np.uint8)


def _bytes_of(buffer: np.ndarray) -> np.ndarray:
    if not buffer.flags.c_contiguous:
        raise ValueError("bucket buffers must be C-contiguous")
    return buffer.reshape(-1).view(np.uint8)


def _dense_into(data: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return data.copy()
    if out.nbytes != data.nbytes:
        raise CodecError(f"bucket has {data.nbytes} bytes, its destination {out.nbytes}")
    _bytes_of(out)[:] = data
    return out


def _zstd() -> Any:
    with require_extra("zstandard (compressed weight buckets)", "rose-transfer[zstd]"):
        import zstandard
    return zstandard


def _compressed(encoded: EncodedBucket, level: int) -> EncodedBucket:
    packed = _zstd().ZstdCompressor(level=level).compress(encoded.payload)
    if len(packed) >= encoded.wire_bytes:
        return encoded
    return EncodedBucket(encoded.encoding + ZSTD_SUFFIX, packed)


def _decompressed(payload: Any, limit: int) -> np.ndarray:
    zstandard = _zstd()
    try:
        raw = zstandard.ZstdDecompressor().decompress(payload, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise CodecError(f"compressed bucket is corrupt: {exc}") from exc
    return np.frombuffer(raw, dtype=np.uint8)
