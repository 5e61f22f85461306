"""Two gloo ranks of a TP-2 trainer each publish their half of versions 1 and 2 through the publisher's
shard intake (real processes, real sockets); a TP-1 receiver and two TP-2 receivers end bit-exact, and
the version is the one ``publish`` of the full state dict would have made (same manifest digest)."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

from rose_core.protocol.messages import ShardView, WeightAnnounce  # noqa: E402
from rose_transfer import ResidentWeights, SparsePublisher, WeightFetcher, flatten  # noqa: E402

from . import tp2_trainer as tp2  # noqa: E402
from .conftest import SECRET  # noqa: E402

BUCKET_BYTES = 4096


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _raw(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's bytes (bfloat16 viewed as int16, as receivers hold it)."""
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.contiguous().numpy().reshape(-1).view(np.uint8)


def _assert_exact(got: dict[str, np.ndarray], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert list(got[name].shape) == list(tensor.shape), name
        assert np.array_equal(got[name].reshape(-1).view(np.uint8), _raw(tensor)), name


def test_two_gloo_ranks_publish_their_halves_and_receivers_end_bit_exact() -> None:
    announced: list[WeightAnnounce] = []
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=BUCKET_BYTES) as publisher:
        intake = publisher.open_shard_intake(tp2.RANKS, timeout=20.0, on_publish=announced.append)
        results = mp.get_context("spawn").SimpleQueue()
        init = f"tcp://127.0.0.1:{_free_port()}"
        mp.spawn(tp2.rank_main, args=(init, intake, SECRET, results), nprocs=tp2.RANKS, join=True)
        by_rank = dict(results.get() for _ in range(tp2.RANKS))
        assert by_rank[0] == by_rank[1]
        assert [(a.version, a.step, a.manifest_digest) for a in announced] == by_rank[0]
        whole, views = ResidentWeights(), {rank: ResidentWeights() for rank in range(tp2.RANKS)}
        fetcher = WeightFetcher(SECRET, "receivers", timeout=10.0)
        for announce in announced:
            version = announce.version
            full = tp2.full_state(version)
            assert announce.manifest_digest == _digest_of_full_publish(full, version)
            fetched = asyncio.run(fetcher.fetch_into(announce, whole))
            _assert_exact(whole.arrays(), full)
            for rank, target in views.items():
                view = ShardView(tp=tp2.RANKS, rank=rank)
                fetched = asyncio.run(fetcher.fetch_into(announce, target, view=view))
                _assert_exact(target.arrays(), tp2.local_state(rank, version))  # what trainer rank ``rank`` held
            if version == 2:
                assert fetched.patched_buckets > 0  # the sparse change travelled as patches
        assert publisher.versions() == [1, 2]


def _digest_of_full_publish(full: dict[str, torch.Tensor], version: int) -> str:
    return flatten(full, version=version, bucket_bytes=BUCKET_BYTES, shards=tp2.SPECS).manifest.digest
