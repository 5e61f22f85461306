"""A torch module whose parameters are views of resident weights: new versions land in it in place."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from rose_transfer import ResidentWeights, WeightFetcher  # noqa: E402
from rose_transfer.serve.sparse_publisher import SparsePublisher  # noqa: E402
from rose_transfer.version.torch_tensors import bind_module, resident_state_dict  # noqa: E402

from .conftest import SECRET  # noqa: E402


class _Block(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(300, 64, dtype=torch.bfloat16)
        self.proj = torch.nn.Linear(64, 96, dtype=torch.bfloat16)
        self.norm = torch.nn.LayerNorm(96, dtype=torch.float32)


def _adam_like_step(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A small fp32 update cast back: most bf16 words absorb it, a few change."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: (t.float() + 1e-3 * torch.randn(t.shape, generator=generator)).to(t.dtype) for name, t in state.items()
    }


@pytest.fixture
def sparse() -> Iterator[SparsePublisher]:
    pub = SparsePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=8 * 1024)
    yield pub
    pub.close()


def test_versions_land_in_the_module_parameters_in_place(sparse: SparsePublisher) -> None:
    trainer = _Block()
    state = {name: t.detach().clone() for name, t in trainer.state_dict().items()}
    fetcher, target = WeightFetcher(SECRET, "module", timeout=5.0), ResidentWeights()
    asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, state), target))
    engine = _Block()
    assert sorted(bind_module(engine, target)) == sorted(state)
    pointers = {name: p.data_ptr() for name, p in engine.named_parameters()}
    for version in (1, 2, 3):
        state = _adam_like_step(state, version)
        fetched = asyncio.run(fetcher.fetch_into(sparse.publish(version, version, state), target))
        assert fetched.patched_buckets > 0
        for name, tensor in engine.state_dict().items():
            assert torch.equal(tensor.view(torch.uint8), state[name].view(torch.uint8)), name
    assert {name: p.data_ptr() for name, p in engine.named_parameters()} == pointers
    with torch.no_grad():
        assert torch.equal(engine.proj(engine.embed(torch.arange(5))), _reference(state)(torch.arange(5)))


def test_the_resident_state_dict_shares_memory(sparse: SparsePublisher) -> None:
    state = {name: t.detach().clone() for name, t in _Block().state_dict().items()}
    fetcher, target = WeightFetcher(SECRET, "sd", timeout=5.0), ResidentWeights()
    asyncio.run(fetcher.fetch_into(sparse.publish(0, 0, state), target))
    tensors = resident_state_dict(target)
    state = _adam_like_step(state, 1)
    asyncio.run(fetcher.fetch_into(sparse.publish(1, 1, state), target))
    assert all(torch.equal(tensors[name].view(torch.uint8), state[name].view(torch.uint8)) for name in state)


def _reference(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    block = _Block()
    block.load_state_dict(state)
    return torch.nn.Sequential(block.embed, block.proj)
