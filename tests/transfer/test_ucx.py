"""The UCX transport: the same weight channel over ucxx (TCP underneath here)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

pytest.importorskip("ucxx")

from rose_transfer import WeightFetcher, load_arrays
from rose_transfer.sparse_publisher import SparsePublisher

from .conftest import SECRET, assert_same, random_state_dict

os.environ.setdefault("UCX_TLS", "tcp,self")
os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


def test_fetch_over_ucx_is_bit_exact(tmp_path: Path) -> None:
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=16 * 1024) as pub:
        source = pub.open_ucx()
        assert source.startswith("ucx://")
        state = random_state_dict(scale=20)
        announce = pub.publish(0, 0, state)
        ucx_announce = type(announce)(
            **{**{f: getattr(announce, f) for f in announce.__struct_fields__}, "source": source}
        )
        fetched = asyncio.run(WeightFetcher(SECRET, "r0", timeout=10.0).fetch(ucx_announce, -1, tmp_path / "v0.bin"))
        assert_same(load_arrays(fetched), state)
