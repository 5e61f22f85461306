"""The shapes a policy's weights take in a rollout engine, read from the checkpoint's files alone: its
safetensors headers mapped through the engine layout the trainer publishes with (``to_engine_layout`` on meta
tensors: fused q/k/v and gate/up, the tied head dropped, the vocabulary padded). What ``EngineWeights.check``
compares with the engine's own parameters when the engine starts, so a model ROSE cannot patch in place is
refused then, not at its first weight update."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rose_core.protocol.engine_layout import EngineLayout
from rose_executor.profile.model_info import read_safetensors_header
from rose_transfer.plan.engine_layout import to_engine_layout

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def engine_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """Every tensor of the policy in ``model_dir`` as a vLLM rollout engine holds it: name -> shape."""
    root = Path(model_dir)
    config = json.loads((root / "config.json").read_text())
    tensors = {}
    for file in sorted(root.glob("*.safetensors")):
        for name, info in read_safetensors_header(file)[0].items():
            if name != "__metadata__":
                dtype = _DTYPES.get(str(info["dtype"]), torch.uint8)
                tensors[name] = torch.empty(info["shape"], dtype=dtype, device="meta")
    layout = EngineLayout(engine="vllm", tie_word_embeddings=bool(config.get("tie_word_embeddings", False)))
    return {name: list(tensor.shape) for name, tensor in to_engine_layout(tensors, layout).items()}
