"""A smoke run of ``rose-transfer bench`` on a tiny model: the keys it promises, and bit-exactness."""

from __future__ import annotations

import pytest

from rose_core.support.errors import ConfigError
from rose_transfer.bench.transfer_bench import BenchConfig, run_transfer_bench

KEYS = [
    "changed_fraction",
    "dense_bytes",
    "cross_cluster_bytes",
    "total_wire_bytes",
    "baseline_seconds",
    "rose_seconds",
    "speedup",
    "encode_gbps",
    "decode_gbps",
    "transport_gbps",
    "ceiling_gbps",
    "bit_exact",
]


def test_tiny_bench_is_bit_exact_and_crosses_little() -> None:
    result = run_transfer_bench(BenchConfig(params=1_000_000, bucket_bytes=1 << 20, repeat=1, link_gbps=4.0))
    assert set(KEYS) <= set(result)
    assert result["bit_exact"] is True
    assert 0 < result["changed_fraction"] < 0.1
    assert result["cross_cluster_bytes"] * 20 <= result["dense_bytes"]
    assert abs(result["cross_cluster_bytes"] - result["plan_cross_cluster_bytes"]) < 0.01 * result["dense_bytes"]
    assert result["baseline_cross_cluster_bytes"] >= result["dense_bytes"]  # two remote receivers, dense


def test_bench_rejects_impossible_layouts() -> None:
    with pytest.raises(ConfigError, match="receiver per cluster"):
        BenchConfig(receivers=1, clusters=2)
    with pytest.raises(ConfigError, match="dest-tp"):
        BenchConfig(dest_tp=3)
