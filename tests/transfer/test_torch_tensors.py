"""torch state dicts (bfloat16 included) travel as raw bits and come back with their dtypes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rose_transfer import DensePublisher, WeightFetcher, flatten, load_arrays

from .conftest import SECRET

torch = pytest.importorskip("torch")
from rose_transfer.version.fetched_version import load_tensors  # noqa: E402
from rose_transfer.version.torch_tensors import torch_dtype  # noqa: E402


def _torch_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(50, 64, generator=gen, dtype=torch.bfloat16),
        "layers.0.q_proj.weight": torch.randn(64, 64, generator=gen, dtype=torch.float16),
        "layers.0.norm.weight": torch.randn(64, generator=gen, dtype=torch.float32),
        "layers.0.mlp.weight.t": torch.randn(64, 30, generator=gen).t(),  # non-contiguous
        "lm_head.weight": torch.randn(50, 64, generator=gen, dtype=torch.bfloat16),
        "counts": torch.randint(-(2**40), 2**40, (9,), generator=gen),
        "fp8": torch.randn(16, generator=gen).to(torch.float8_e4m3fn),
    }


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


async def test_torch_round_trip_bit_exact_with_dtypes(tmp_path: Path) -> None:
    tensors = _torch_state_dict()
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=4096) as publisher:
        fetched = await WeightFetcher(SECRET, "r").fetch(publisher.publish(1, 0, tensors), -1, tmp_path / "v1.bin")
    by_name = dict(load_tensors(fetched))
    assert list(by_name) == list(tensors)
    for name, want in tensors.items():
        got = by_name[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert _bits(got) == _bits(want), name
    entries = {e.name: e.dtype for e in fetched.entries}
    assert entries["embed.weight"] == "bfloat16" and entries["fp8"] == "float8_e4m3fn"
    assert entries["layers.0.q_proj.weight"] == "float16"
    arrays = load_arrays(fetched)  # numpy sees bfloat16 as its int16 bits
    assert arrays["embed.weight"].dtype == np.int16
    assert arrays["embed.weight"].tobytes() == tensors["embed.weight"].view(torch.int16).numpy().tobytes()


def test_loaded_tensors_are_writable_without_touching_the_file(tmp_path: Path) -> None:
    flat = flatten({"w": torch.ones(8, dtype=torch.bfloat16)}, version=0)
    path = tmp_path / "v0.bin"
    path.write_bytes(flat.stream.tobytes())
    from rose_transfer import FetchedVersion

    fetched = FetchedVersion(version=0, path=path, entries=flat.manifest.tensors, bytes_received=0, seconds=0.0)
    ((_name, tensor),) = load_tensors(fetched)
    tensor.zero_()
    assert path.read_bytes() == flat.stream.tobytes()


def test_mixed_numpy_and_torch_inputs() -> None:
    flat = flatten({"a": np.arange(4, dtype=np.float32), "b": torch.arange(4, dtype=torch.bfloat16)}, version=0)
    assert [e.dtype for e in flat.manifest.tensors] == ["float32", "bfloat16"]


def test_torch_dtype_names() -> None:
    assert torch_dtype("bfloat16") is torch.bfloat16
    assert torch_dtype("float32") is torch.float32
    assert torch_dtype("int64") is torch.int64
    assert torch_dtype("bool") is torch.bool
