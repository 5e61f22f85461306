"""What the executor agent tests share, whether the agent runs in its own process over ZMQ (``test_agent``) or
on this event loop over the in-process twins (``test_agent_twin``): the turns they send and the config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import tomli_w

from rose_core.protocol.messages import SamplingParams, TurnRequest
from rose_executor.memory.serving_first_budget import footprint

PROMPT = np.array([7, 21, 33, 45, 58, 61, 70, 85, 99], dtype=np.int32)
GREEDY = SamplingParams(max_tokens=10, temperature=0.0)
LONG = SamplingParams(max_tokens=900, temperature=0.0)
ROLLOUT_SEQ_BYTES = (len(PROMPT) + LONG.max_tokens) * 512  # the policy's KV bytes per token

H200_BYTES = 143_771_287_552
"""What torch reports as an H200's total memory."""


def memory_settings(policy: Path, serving: Path) -> dict[str, object]:
    """A device share whose rollout budget holds 2.5 long rollout turns (one after the 2x cut), and a high
    watermark so low (5% of the 20% headroom, ~58 KB here) that a serving request reserving 300 tokens (2 KiB of
    KV each) crosses it while the short ones of the other tests (7 tokens) do not."""
    weights = footprint(str(serving), "bfloat16").weight_bytes + footprint(str(policy), "bfloat16").weight_bytes
    device = int((2.5 * ROLLOUT_SEQ_BYTES + weights) / 0.8)
    return {"memory": {"device_bytes": device, "high_watermark": 0.05}}


def write_config(
    path: Path, policy: Path, serving: Path, port: int, profiles: Path | None = None, **extra: object
) -> Path:
    """A serving host's config; ``extra``: more settings, a section as a dict (``memory={...}``)."""
    sections: dict[str, dict[str, object]] = {
        "rollout": {"model_dir": str(policy), "capacity": 2},
        "serving": {"model_dir": str(serving), "model_name": "prod", "port": port},
        # An SLO no request can meet: serving traffic takes the headroom away for `latency_window_s`.
        "slo": {"ttft_ms": 0.001, "tpot_ms": 0.001, "latency_window_s": 2.0},
    }
    top: dict[str, object] = {"kv_cache_gib": 0.5, "max_model_len": 1024,
                              "profile_cache_dir": str(profiles or path.parent / "profiles")}
    for key, value in extra.items():
        if isinstance(value, dict):
            sections.setdefault(key, {}).update(value)
        else:
            top[key] = value
    path.write_text(tomli_w.dumps({**top, **sections}))
    return path


def turn(turn_id: str, version: int = 0, sampling: SamplingParams = GREEDY, prompt: np.ndarray = PROMPT) -> TurnRequest:
    return TurnRequest(
        turn_id=turn_id,
        trajectory_id=f"traj-{turn_id}",
        attempt=0,
        prompt_token_ids=prompt,
        sampling=sampling,
        min_version=version,
        max_version=version,
    )


def nvml_gpus(monkeypatch: Any, count: int, runtime_allowed: Callable[[], bool] = lambda: True) -> None:
    """torch built with CUDA on a host where NVML sees ``count`` H200s (0: none), patched below torch's own
    ``torch.cuda`` functions so that they run as on a GPU host. The CUDA runtime (``cudaGetDeviceCount``, what
    ``torch.cuda.is_available()`` calls unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, and reading a device's
    properties) raises while ``runtime_allowed()`` is false: touching it then would poison vLLM's forks."""
    import torch

    def runtime(what: str) -> None:
        if not runtime_allowed():
            raise AssertionError(f"the CUDA runtime was initialised ({what}) before vLLM's engines started")

    def runtime_count() -> int:
        runtime("cudaGetDeviceCount")
        return count

    def properties(index: int) -> SimpleNamespace:
        runtime(f"the properties of device {index}")
        return SimpleNamespace(name="NVIDIA H200", total_memory=H200_BYTES)

    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "")  # restored (absent, as a rule) after the test...
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK")  # ...and unset in it, as on a fresh host
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: count)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", runtime_count, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
