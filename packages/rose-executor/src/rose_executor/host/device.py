"""The device this executor's engines run on: the config's ``device`` setting resolved against what torch sees,
and how it is described to the controller (``Register.device`` / ``memory_bytes``).

The one module of the executor that asks torch about devices. torch is imported only when a question needs it
(``"auto"`` and CUDA settings), so an executor configured for ``"cpu"`` never imports it here.

Rule: nothing here initialises the CUDA runtime before vLLM's engines exist. vLLM forks its engine cores (it
switches to spawn only once ``torch.cuda.is_initialized()``), and a child forked after the parent ran
``cudaGetDeviceCount`` (what ``torch.cuda.is_available()`` calls by default) cannot use CUDA. So GPUs are
counted through NVML (``torch.cuda.device_count()``, with ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` set as vLLM sets
it), never ``is_available()``; reading a device's name and memory (``describe_device``) initialises CUDA, and the
agent does it once the engines have started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import psutil

from rose_core.config.executor_config import parse_device
from rose_core.support.errors import RoseError, require_extra

DeviceKind = Literal["cpu", "cuda"]


@dataclass(frozen=True, slots=True)
class Device:
    """A resolved device: the CPU, or ``tensor_parallel_size`` CUDA devices from ``index`` (``None``: vLLM's
    default, the visible devices from 0)."""

    kind: DeviceKind
    index: int | None = None
    tensor_parallel_size: int = 1

    @property
    def on_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def setting(self) -> str:
        """``"cpu"``, ``"cuda"`` or ``"cuda:N"``: what ``EngineSpec.device`` carries."""
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    def indices(self) -> list[int]:
        """The CUDA device indices the engines use (none on CPU)."""
        if not self.on_gpu:
            return []
        first = self.index or 0
        return list(range(first, first + self.tensor_parallel_size))


@dataclass(frozen=True, slots=True)
class DeviceDescription:
    """What ``Register`` says about the device: ``"cpu"`` or e.g. ``"cuda:0 (NVIDIA H200)"``, and its memory
    (host RAM on CPU; the device memory of every GPU the engines use on CUDA)."""

    device: str
    memory_bytes: int


def resolve_device(setting: str, tensor_parallel_size: int = 1) -> Device:
    """The device ``setting`` names (``"auto"``: CUDA when torch sees a GPU, else the CPU); ``RoseError``
    naming the fix if it is malformed, names GPUs this host lacks, or shards over GPUs on a CPU."""
    try:
        kind, index = parse_device(setting)
    except ValueError as exc:
        raise RoseError(f"{exc}: fix `device` in the executor config") from exc
    if kind == "auto":
        kind = "cuda" if _gpu_count() > 0 else "cpu"
    if kind == "cpu":
        if tensor_parallel_size != 1:
            raise RoseError(
                f"tensor_parallel_size = {tensor_parallel_size} needs GPUs, but device {setting!r} is the CPU: "
                "set tensor_parallel_size = 1, or run on a GPU host"
            )
        return Device("cpu")
    device = Device("cuda", index, tensor_parallel_size)
    _require_visible(device, setting)
    return device


def describe_device(device: Device) -> DeviceDescription:
    """The device and its memory as ``Register`` reports them."""
    if not device.on_gpu:
        return DeviceDescription("cpu", int(psutil.virtual_memory().total))
    cuda = _cuda()
    indices = device.indices()
    properties = [cuda.get_device_properties(i) for i in indices]
    where = f"cuda:{indices[0]}" if len(indices) == 1 else f"cuda:{indices[0]}-{indices[-1]}"
    name = str(properties[0].name) + (f" x{len(indices)}" if len(indices) > 1 else "")
    return DeviceDescription(f"{where} ({name})", sum(int(p.total_memory) for p in properties))


def _require_visible(device: Device, setting: str) -> None:
    count = _gpu_count()
    if count == 0:
        raise RoseError(
            f"device = {setting!r}, but torch sees no CUDA device: install rose-executor[gpu] on a GPU host, "
            'or set device = "cpu"'
        )
    if device.tensor_parallel_size > count:
        raise RoseError(
            f"tensor_parallel_size = {device.tensor_parallel_size} needs as many GPUs, but {count} are visible: "
            f"set tensor_parallel_size to at most {count}"
        )
    wanted = device.indices()
    if wanted[-1] >= count:
        raise RoseError(
            f"device = {setting!r} with tensor_parallel_size = {device.tensor_parallel_size} needs CUDA devices "
            f"{wanted[0]}..{wanted[-1]}, but {count} are visible: pick a device from cuda:0 to "
            f"cuda:{count - device.tensor_parallel_size}"
        )


def _gpu_count() -> int:
    """The GPUs NVML sees (torch falls back to the CUDA runtime only where NVML cannot answer)."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # vLLM's children check the same way
    return int(_cuda().device_count())


def _cuda() -> ModuleType:
    with require_extra("torch", "'rose-executor[cpu]' (or [gpu] on a GPU host)"):
        import torch
    return torch.cuda
