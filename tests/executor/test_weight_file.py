from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rose_core.errors import ConfigError
from rose_executor.config import parse_executor_config
from rose_executor.engine.model_info import describe_model
from rose_executor.engine.weight_file import flat_file_from_safetensors
from rose_executor.engine.worker_extension import tensors_from_buffer


def test_flat_file_round_trips_a_checkpoint_bit_exactly(policy_dir: Path, tmp_path: Path) -> None:
    entries = flat_file_from_safetensors(policy_dir, tmp_path / "v0.bin")
    want = load_file(str(policy_dir / "model.safetensors"))
    assert sorted(e.name for e in entries) == sorted(want)
    assert all(e.offset % 64 == 0 for e in entries)
    with open(tmp_path / "v0.bin", "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    wire = [[e.name, e.dtype, e.shape, e.offset, e.nbytes] for e in entries]
    got = dict(tensors_from_buffer(buffer, wire))
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype == torch.bfloat16
        assert torch.equal(got[name].view(torch.int16), tensor.view(torch.int16)), name


def test_mixed_dtypes_and_empty_tensors(tmp_path: Path) -> None:
    tensors = {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.tensor([1, -2, 3], dtype=torch.int64),
        "c": torch.zeros((0, 4), dtype=torch.float16),
        "d": torch.randn(5).to(torch.bfloat16),
    }
    save_file(tensors, str(tmp_path / "x.safetensors"))
    entries = flat_file_from_safetensors(tmp_path / "x.safetensors", tmp_path / "x.bin")
    data = bytearray((tmp_path / "x.bin").read_bytes())
    got = dict(tensors_from_buffer(data, [[e.name, e.dtype, e.shape, e.offset, e.nbytes] for e in entries]))
    for name, tensor in tensors.items():
        assert got[name].dtype == tensor.dtype
        assert torch.equal(got[name], tensor)


def test_unknown_dtype_is_named() -> None:
    with pytest.raises(ValueError, match="unsupported dtype 'complex32'"):
        list(tensors_from_buffer(bytearray(8), [["w", "complex32", [1], 0, 4]]))


def test_config_errors_name_the_field(tmp_path: Path, policy_dir: Path) -> None:
    with pytest.raises(ConfigError, match="`headroom_fraction` must be in"):
        parse_executor_config(f'policy_model_dir = "{policy_dir}"\nheadroom_fraction = 1.5')
    with pytest.raises(ConfigError, match="field `rollout_capacity`: Expected `int`"):
        parse_executor_config(f'policy_model_dir = "{policy_dir}"\nrollout_capacity = "many"')
    with pytest.raises(ConfigError, match="unknown field `kv_cache`"):
        parse_executor_config(f'policy_model_dir = "{policy_dir}"\nkv_cache = 1')
    config = parse_executor_config(f'policy_model_dir = "{policy_dir}"')
    config.check_role("dedicated")
    with pytest.raises(ConfigError, match="role `serving` needs `serving_model_dir`"):
        config.check_role("serving")
    with pytest.raises(ConfigError, match="is not a model directory"):
        parse_executor_config(f'policy_model_dir = "{tmp_path}"').check_role("dedicated")


def test_model_info_reads_the_checkpoint(policy_dir: Path) -> None:
    info = describe_model(policy_dir, "rollout")
    assert info.name == "policy"
    assert info.parameters == sum(t.numel() for t in load_file(str(policy_dir / "model.safetensors")).values())
    assert info.kv_bytes_per_token == 2 * 2 * 2 * 32 * 2  # K and V, 2 layers, 2 kv heads, head_dim 32, bf16
