"""A weight version as one flat byte stream plus the ``WeightManifest`` that describes it.

Tensors sit in the stream in the order given, each at an offset aligned to ``ALIGN`` bytes (padding is
zero), so a receiver can view every tensor in place from a memory-mapped file. The stream is cut into
buckets of ``bucket_bytes`` (the last one shorter), each with a BLAKE3-256 checksum. The manifest digest
(BLAKE3-256 too) covers the version, the layout and the bucket checksums, not how buckets travel (their
encoding).

Both hashes are cryptographic (decision 724): the controller's signed announce carries the digest, so a
receiver that checks its manifest against the announce and every bucket against the manifest holds the
trainer's bytes, whoever served them. A relay or any other holder of the weights key can fail a fetch
but cannot make a forged bucket pass (with xxh3, a non-cryptographic hash, colliding buckets can be
built: ``tests/transfer/test_forged_buckets.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import blake3
import msgspec
import numpy as np

from rose_core.protocol.messages import BucketInfo, ShardView, TensorEntry, WeightManifest
from rose_core.support.errors import RoseError
from rose_transfer.errors import TransferError
from rose_transfer.version.dtypes import numpy_travel_form, storage_dtype, travel_dtype
from rose_transfer.version.host_buffer import host_buffer

DEFAULT_BUCKET_BYTES = 64 * 1024 * 1024
ALIGN = 64


@dataclass(slots=True, frozen=True)
class FlatVersion:
    """A published weight version: its manifest and the bytes it describes."""

    manifest: WeightManifest
    stream: np.ndarray  # uint8, manifest.total_bytes long

    def bucket(self, index: int) -> np.ndarray:
        info = self.manifest.buckets[index]
        return self.stream[info.offset : info.offset + info.nbytes]


def bucket_checksum(data: Any) -> str:
    """BLAKE3-256 of a bucket, hex (one core here: 4.29-4.46 GB/s, xxh3-64 18.3-20.1; docs/benchmarks.md)."""
    return str(blake3.blake3(data).hexdigest())


def checksum_stream() -> Any:
    """A ``bucket_checksum`` fed piece by piece (``update``), read with ``hexdigest()``."""
    return blake3.blake3()


def _is_torch_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (only possible when torch is already loaded: never imports it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _describe(name: str, obj: Any) -> tuple[str, list[int], int]:
    if _is_torch_tensor(obj):
        from rose_transfer.version.torch_tensors import describe

        return describe(obj)
    if not isinstance(obj, np.ndarray):
        raise RoseError(f"weight {name!r} is a {type(obj).__name__}: publish numpy arrays or torch tensors")
    storage, dtype = travel_dtype(obj.dtype)
    return dtype, [int(n) for n in obj.shape], obj.size * storage.itemsize


def travel_bytes(obj: Any) -> np.ndarray:
    """The bytes of ``obj`` (numpy array or torch tensor) as they sit in a stream: uint8, flat."""
    if _is_torch_tensor(obj):
        from rose_transfer.version.torch_tensors import tensor_travel_form

        array = tensor_travel_form(obj)[0]
    else:
        array = numpy_travel_form(obj)[0]
    return np.asarray(array).reshape(-1).view(np.uint8)


def align_offset(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(tensors: Mapping[str, Any], shards: Mapping[str, str] | None = None) -> tuple[list[TensorEntry], int]:
    """The entry of every tensor and the stream length, without touching tensor data. ``shards``
    gives the shard spec text of tensors that are not replicated (see ``shard_spec``)."""
    entries: list[TensorEntry] = []
    offset = 0
    for name, obj in tensors.items():
        if not isinstance(name, str) or not name:
            raise RoseError(f"weight names must be non-empty strings, got {name!r}")
        dtype, shape, nbytes = _describe(name, obj)
        offset = align_offset(offset)
        shard = (shards or {}).get(name, "replicated")
        entries.append(TensorEntry(name=name, dtype=dtype, shape=shape, offset=offset, nbytes=nbytes, shard=shard))
        offset += nbytes
    return entries, offset


def plan_buckets(stream: np.ndarray, bucket_bytes: int) -> list[BucketInfo]:
    if bucket_bytes <= 0:
        raise RoseError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets = []
    for index, offset in enumerate(range(0, stream.nbytes, bucket_bytes)):
        data = stream[offset : offset + bucket_bytes]
        buckets.append(BucketInfo(index=index, offset=offset, nbytes=data.nbytes, checksum=bucket_checksum(data)))
    return buckets


def flatten(
    tensors: Mapping[str, Any],
    *,
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    base_version: int = -1,
    shards: Mapping[str, str] | None = None,
    allocate: Callable[[int], np.ndarray] = host_buffer,
) -> FlatVersion:
    """Copy ``tensors`` (name -> numpy array or torch tensor) into one stream (from ``allocate``: a
    publisher's ``BufferPool.take`` recycles retired versions' streams) and describe it."""
    entries, total = layout(tensors, shards)
    objects = dict(zip((e.name for e in entries), tensors.values(), strict=True))

    def fill(entry: TensorEntry, region: np.ndarray) -> None:
        region[:] = travel_bytes(objects[entry.name])

    return build_version(
        entries, total, fill, version=version, bucket_bytes=bucket_bytes, base_version=base_version, allocate=allocate
    )


def build_version(
    entries: list[TensorEntry],
    total: int,
    fill: Callable[[TensorEntry, np.ndarray], None],
    *,
    version: int,
    bucket_bytes: int,
    base_version: int = -1,
    view: ShardView | None = None,
    source_digest: str = "",
    allocate: Callable[[int], np.ndarray] = host_buffer,
) -> FlatVersion:
    """A stream of ``total`` bytes laid out as ``entries`` (``fill`` writes each tensor's region, the
    padding between them is zero), cut into checksummed buckets and described by a digested manifest."""
    stream = allocate(total)
    end = 0
    for entry in entries:
        stream[end : entry.offset] = 0
        fill(entry, stream[entry.offset : entry.offset + entry.nbytes])
        end = entry.offset + entry.nbytes
    buckets = plan_buckets(stream, bucket_bytes)
    head = VersionHead(version, bucket_bytes, base_version, view, source_digest)
    return FlatVersion(manifest=digested_manifest(head, entries, total, buckets), stream=stream)


@dataclass(slots=True, frozen=True)
class VersionHead:
    """What a manifest says besides its layout: the version, its bucket size, what it was cut from."""

    version: int
    bucket_bytes: int
    base_version: int = -1
    view: ShardView | None = None
    source_digest: str = ""


def digested_manifest(
    head: VersionHead, entries: list[TensorEntry], total: int, buckets: list[BucketInfo]
) -> WeightManifest:
    """The manifest of a stream of ``total`` bytes laid out as ``entries``, cut into ``buckets``."""
    manifest = WeightManifest(
        version=head.version,
        base_version=head.base_version,
        total_bytes=total,
        bucket_bytes=head.bucket_bytes,
        tensors=entries,
        buckets=buckets,
        digest="",
        view=head.view,
        source_digest=head.source_digest,
    )
    manifest.digest = manifest_digest(manifest)
    return manifest


def manifest_digest(manifest: WeightManifest) -> str:
    """BLAKE3-256 over the version, the tensor layout and the bucket checksums (fields a receiver checks)."""
    content = (
        manifest.version,
        manifest.total_bytes,
        manifest.bucket_bytes,
        [(t.name, t.dtype, t.shape, t.offset, t.nbytes, t.shard) for t in manifest.tensors],
        [(b.index, b.offset, b.nbytes, b.checksum) for b in manifest.buckets],
        *((manifest.view.tp, manifest.view.rank, manifest.source_digest) if manifest.view else ()),
    )
    return str(blake3.blake3(msgspec.msgpack.encode(content)).hexdigest())


def tensor_views(stream: Any, entries: list[TensorEntry]) -> dict[str, np.ndarray]:
    """Each tensor as a numpy view into ``stream`` (bfloat16 as int16 bits, float8 as uint8)."""
    flat = stream.view(np.uint8) if isinstance(stream, np.ndarray) else np.frombuffer(stream, dtype=np.uint8)
    views = {}
    for entry in entries:
        dtype = storage_dtype(entry.dtype)
        data = flat[entry.offset : entry.offset + entry.nbytes]
        views[entry.name] = data.view(dtype).reshape(entry.shape)
    return views


def check_manifest(
    manifest: WeightManifest, *, version: int, digest: str = "", view: ShardView | None = None
) -> None:
    """Raise ``TransferError`` unless ``manifest`` is the consistent manifest of ``version`` (as
    ``view`` holds it; ``digest``: the whole version's, from its announce)."""
    problem = _manifest_problem(manifest, version, digest, view)
    if problem:
        raise TransferError(
            f"the manifest of weight version {version} is unusable ({problem}): "
            "run the same rose-transfer version on the publisher and the receivers"
        )


def _manifest_problem(m: WeightManifest, version: int, digest: str, view: ShardView | None) -> str:
    if m.version != version:
        return f"it describes version {m.version}"
    if m.view != view:
        return f"it is the view {m.view} where {view} was asked"
    if manifest_digest(m) != m.digest or (digest and digest != (m.source_digest if m.view else m.digest)):
        return "its digest does not match"
    if m.bucket_bytes <= 0 or m.total_bytes < 0:
        return "bad sizes"
    offset = 0
    for index, bucket in enumerate(m.buckets):
        if bucket.index != index or bucket.offset != offset or not 0 < bucket.nbytes <= m.bucket_bytes:
            return f"bucket {index} is out of place"
        offset += bucket.nbytes
    if offset != m.total_bytes:
        return "its buckets do not cover the stream"
    return _tensors_problem(m.tensors, m.total_bytes)


def _tensors_problem(entries: list[TensorEntry], total: int) -> str:
    names = set()
    for entry in entries:
        try:
            itemsize = storage_dtype(entry.dtype).itemsize
        except RoseError:
            return f"tensor {entry.name!r} has unknown dtype {entry.dtype!r}"
        count = int(np.prod(entry.shape, dtype=np.int64)) if entry.shape else 1
        if min(entry.shape, default=0) < 0 or count * itemsize != entry.nbytes:
            return f"tensor {entry.name!r} has {entry.nbytes} bytes for shape {entry.shape}"
        if entry.offset < 0 or entry.offset + entry.nbytes > total or entry.offset % itemsize:
            return f"tensor {entry.name!r} lies outside the stream"
        if entry.name in names:
            return f"tensor {entry.name!r} appears twice"
        names.add(entry.name)
    return ""
