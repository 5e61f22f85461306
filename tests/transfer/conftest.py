from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rose_transfer import DensePublisher, WeightFetcher

SECRET = b"transfer-tests-secret-0123456789"


def random_state_dict(seed: int = 0, scale: int = 1) -> dict[str, np.ndarray]:
    """A small model-like state dict of mixed dtypes and odd sizes (so tensors straddle buckets)."""
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((64 * scale, 96), dtype=np.float32),
        "layers.0.attn.qkv.weight": rng.standard_normal((3 * 96, 96)).astype(np.float16),
        "layers.0.attn.qkv.bias": rng.standard_normal(3 * 96).astype(np.float16),
        "layers.0.mlp.weight": rng.standard_normal((37 * scale, 101), dtype=np.float32),
        "layers.0.norm.weight": np.ones(96, dtype=np.float32),
        "positions": rng.integers(-(2**40), 2**40, size=(13, 7), dtype=np.int64),
        "step": np.array(7, dtype=np.int32),
        "mask": rng.random(33) > 0.5,
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


@pytest.fixture
def publisher() -> Iterator[DensePublisher]:
    pub = DensePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=16 * 1024)
    yield pub
    pub.close()


@pytest.fixture
def fetcher() -> WeightFetcher:
    return WeightFetcher(SECRET, "test-receiver", timeout=5.0)
