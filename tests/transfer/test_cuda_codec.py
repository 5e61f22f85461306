"""The device codec on CPU tensors (bit-exact against the numpy codec), and on a GPU when present."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rose_transfer.bench import cuda_codec  # noqa: E402
from rose_transfer.codec.bucket_codec import decode_bucket, encode_bucket  # noqa: E402
from rose_transfer.codec.words import word_view  # noqa: E402


def _pair(n: int, fraction: float, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(n, generator=gen).to(dtype)
    new = old.clone()
    picked = torch.rand(n, generator=gen) < fraction
    new[picked] = torch.randn(int(picked.sum()), generator=gen).to(dtype)
    new[:3] = torch.tensor([float("nan"), -0.0, 0.0]).to(dtype)  # exact bits, not float equality
    return old, new


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.5])
def test_cpu_patch_matches_the_numpy_codec(dtype: torch.dtype, fraction: float) -> None:
    old, new = _pair(50_001, fraction, dtype)
    patch = cuda_codec.encode(old, new)
    word = old.element_size()
    old_np = cuda_codec.words(old).numpy().view(np.uint8)
    new_np = cuda_codec.words(new).numpy().view(np.uint8)
    expected = np.flatnonzero(word_view(old_np, word) != word_view(new_np, word))
    assert np.array_equal(patch.positions.numpy(), expected)
    decoded = cuda_codec.decode(old, patch)
    assert torch.equal(cuda_codec.words(decoded), cuda_codec.words(new))
    encoded = encode_bucket(old_np, new_np, word_bytes=word)
    assert np.array_equal(
        decode_bucket(encoded.encoding, encoded.payload, old_np), cuda_codec.words(decoded).numpy().view(np.uint8)
    )


def test_decode_in_place_and_errors() -> None:
    old, new = _pair(1000, 0.1, torch.bfloat16)
    base = old.clone()
    cuda_codec.decode(base, cuda_codec.encode(old, new), out=base)
    assert torch.equal(base.view(torch.int16), new.view(torch.int16))
    with pytest.raises(ValueError, match="differ"):
        cuda_codec.encode(old, new.float())
    with pytest.raises(ValueError, match="elements"):
        cuda_codec.decode(old[:10], cuda_codec.encode(old, new))


@pytest.mark.gpu
def test_gpu_codec_is_bit_exact() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    old, new = (t.cuda() for t in _pair(3_000_017, 0.01, torch.bfloat16))
    patch = cuda_codec.encode(old, new)
    naive = (old.view(torch.int16) != new.view(torch.int16)).nonzero().reshape(-1)
    assert torch.equal(patch.positions, naive)
    assert torch.equal(cuda_codec.decode(old, patch).view(torch.int16), new.view(torch.int16))


def test_triton_kernels_are_bit_exact_in_the_interpreter() -> None:
    """The Triton kernels themselves, run on CPU by Triton's interpreter (where Triton is installed)."""
    pytest.importorskip("triton")
    script = """
import torch
from rose_transfer.bench import cuda_codec as cc
old = torch.randn(100_003).to(torch.bfloat16)
new = old.clone()
picked = torch.rand(old.numel()) < 0.01
new[picked] = torch.randn(int(picked.sum())).to(torch.bfloat16)
a, b = cc.words(old), cc.words(new)
patch = cc._encode_triton(a, b)
naive = (a != b).nonzero().reshape(-1)
assert patch is not None and torch.equal(patch.positions, naive) and torch.equal(patch.values, b[naive])
assert torch.equal(cc.words(cc.decode(old, patch)), b)
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
