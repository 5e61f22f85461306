from __future__ import annotations

import subprocess
import sys
from typing import Any

import msgspec
import numpy as np
import pytest

from rose_core.protocol.messages import WeightManifest
from rose_core.support.errors import RoseError
from rose_transfer.errors import TransferError
from rose_transfer.version.manifest import (
    ALIGN,
    bucket_checksum,
    check_manifest,
    flatten,
    manifest_digest,
    tensor_views,
)

from .conftest import assert_same, random_state_dict


def test_flatten_and_views_round_trip_bit_exact() -> None:
    tensors = random_state_dict()
    flat = flatten(tensors, version=3, bucket_bytes=4096)
    assert_same(tensor_views(flat.stream, flat.manifest.tensors), tensors)
    check_manifest(flat.manifest, version=3, digest=flat.manifest.digest)


def test_layout_is_aligned_and_buckets_cover_the_stream() -> None:
    flat = flatten(random_state_dict(), version=0, bucket_bytes=5000)
    manifest = flat.manifest
    assert all(entry.offset % ALIGN == 0 for entry in manifest.tensors)
    assert sum(b.nbytes for b in manifest.buckets) == manifest.total_bytes == flat.stream.nbytes
    assert len(manifest.buckets) > 10
    assert all(b.nbytes == 5000 for b in manifest.buckets[:-1])
    for bucket in manifest.buckets:
        assert bucket.checksum == bucket_checksum(flat.bucket(bucket.index))


def test_padding_is_zero_so_checksums_are_deterministic() -> None:
    first = flatten(random_state_dict(), version=1, bucket_bytes=4096)
    second = flatten(random_state_dict(), version=1, bucket_bytes=4096)
    assert first.manifest.digest == second.manifest.digest
    assert first.stream.tobytes() == second.stream.tobytes()


def test_digest_changes_with_one_flipped_bit() -> None:
    tensors = random_state_dict()
    before = flatten(tensors, version=1).manifest.digest
    tensors["layers.0.norm.weight"][5] = np.nextafter(np.float32(1), np.float32(2))
    assert flatten(tensors, version=1).manifest.digest != before


def test_big_endian_and_non_contiguous_inputs_travel_as_little_endian_values() -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    tensors = {"be": base.astype(">f4"), "strided": base[:, ::2]}
    flat = flatten(tensors, version=0)
    views = tensor_views(flat.stream, flat.manifest.tensors)
    assert views["be"].dtype == np.dtype("<f4") and np.array_equal(views["be"], base)
    assert np.array_equal(views["strided"], base[:, ::2])


def test_empty_state_dict() -> None:
    flat = flatten({}, version=0)
    assert flat.manifest.total_bytes == 0 and flat.manifest.buckets == []
    check_manifest(flat.manifest, version=0)


@pytest.mark.parametrize(
    ("tensors", "fragment"),
    [
        ({"x": np.array(["a"], dtype=object)}, "only numeric"),
        ({"x": [1.0, 2.0]}, "publish numpy arrays or torch tensors"),
        ({"": np.zeros(2)}, "non-empty strings"),
    ],
)
def test_bad_inputs_name_the_problem(tensors: dict, fragment: str) -> None:
    with pytest.raises(RoseError, match=fragment):
        flatten(tensors, version=0)


def _tampered(manifest: WeightManifest, **changes: Any) -> WeightManifest:
    copy = msgspec.structs.replace(manifest, **changes)
    copy.digest = manifest_digest(copy)
    return copy


def test_check_manifest_rejects_inconsistent_manifests() -> None:
    manifest = flatten(random_state_dict(), version=2, bucket_bytes=4096).manifest
    with pytest.raises(TransferError, match="describes version 2"):
        check_manifest(manifest, version=3)
    with pytest.raises(TransferError, match="digest"):
        check_manifest(manifest, version=2, digest="0" * 32)
    with pytest.raises(TransferError, match="cover"):
        check_manifest(_tampered(manifest, total_bytes=manifest.total_bytes + 1), version=2)
    entry = msgspec.structs.replace(manifest.tensors[0], nbytes=manifest.tensors[0].nbytes + 4)
    with pytest.raises(TransferError, match="bytes for shape"):
        check_manifest(_tampered(manifest, tensors=[entry, *manifest.tensors[1:]]), version=2)
    entry = msgspec.structs.replace(manifest.tensors[0], dtype="complex512")
    with pytest.raises(TransferError, match="unknown dtype"):
        check_manifest(_tampered(manifest, tensors=[entry]), version=2)
    bucket = msgspec.structs.replace(manifest.buckets[1], offset=1)
    with pytest.raises(TransferError, match="out of place"):
        check_manifest(_tampered(manifest, buckets=[manifest.buckets[0], bucket, *manifest.buckets[2:]]), version=2)


def test_publishing_numpy_never_imports_torch() -> None:
    code = (
        "import sys, numpy as np; from rose_transfer import flatten; "
        "flatten({'w': np.ones(3)}, version=0); "
        "sys.exit('torch was imported' if 'torch' in sys.modules else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
