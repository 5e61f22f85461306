"""What an executor tells the controller about a model directory, read from its files (no torch, no vllm)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, Literal

from rose_core.protocol.messages import ModelInfo

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8}


def describe_model(model_dir: str | Path, purpose: Literal["serving", "rollout"], name: str = "") -> ModelInfo:
    root = Path(model_dir)
    config = json.loads((root / "config.json").read_text())
    return ModelInfo(
        name=name or root.name,
        purpose=purpose,
        path=str(root.resolve()),
        parameters=count_parameters(root),
        kv_bytes_per_token=kv_bytes_per_token(config),
    )


def count_parameters(model_dir: Path) -> int:
    """Sum of tensor elements over the checkpoint's safetensors headers."""
    total = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        for name, info in read_safetensors_header(file)[0].items():
            if name != "__metadata__":
                total += math.prod(info["shape"])
    return total


def read_safetensors_header(file: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and the offset where its tensor bytes start."""
    with open(file, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(length))
    return header, 8 + length


def kv_bytes_per_token_of(model_dir: str | Path) -> int:
    return kv_bytes_per_token(json.loads((Path(model_dir) / "config.json").read_text()))


def kv_bytes_per_token(config: dict[str, Any]) -> int:
    """K and V bytes one token occupies across all layers, in the checkpoint dtype."""
    text = config.get("text_config", config)
    heads = int(text.get("num_attention_heads", 0) or 0)
    if heads == 0:
        return 0
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or text["hidden_size"] // heads)
    layers = int(text.get("num_hidden_layers", 0))
    dtype = str(text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    return 2 * layers * kv_heads * head_dim * dtype_bytes(dtype)


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (a config or vLLM dtype name); 2 for names it does not know."""
    return _DTYPE_BYTES.get(dtype, 2)
