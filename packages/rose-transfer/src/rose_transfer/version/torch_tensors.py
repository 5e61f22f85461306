"""The host side's one module that imports torch: tensors in, tensors out.

Imported only when a torch tensor is handed in (``sys.modules`` already holds torch) or when a caller
asks for torch tensors back; installing rose-transfer never pulls torch (it is the ``[torch]`` extra).
It depends only on ``dtypes``: what it binds to is described by ``HeldWeights`` (which
``resident.resident_weights.ResidentWeights`` is), and ``fetched_version.load_tensors`` calls it.
(The device codec, ``bench.cuda_codec``, imports torch itself: it must load without rose.)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Protocol, cast

import numpy as np

from rose_core.protocol.messages import WeightManifest
from rose_core.support.errors import RoseError, require_extra
from rose_transfer.version.dtypes import RAW_DTYPES, storage_dtype

with require_extra("torch (to hand weights to a model)", "rose-transfer[torch]"):
    import torch

Tensor = torch.Tensor


class HeldWeights(Protocol):
    """A version held in memory whose tensors can be handed out as views (``ResidentWeights``)."""

    manifest: WeightManifest | None
    pinned: bool  # views were handed out: the buffer must never be swapped from under them

    def arrays(self) -> dict[str, np.ndarray]: ...


def _raw_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_travel_form(tensor: torch.Tensor) -> tuple[np.ndarray, str]:
    """A CPU tensor's bytes as a contiguous numpy array of its storage dtype, and its dtype name."""
    t = tensor.detach().contiguous().cpu()
    name = _raw_name(t.dtype)
    raw = RAW_DTYPES.get(name)
    if raw is not None:
        return t.view(_torch_dtype_of(raw)).numpy(), name
    return t.numpy(), name


def _torch_dtype_of(np_dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a tensor that travelled as ``name``."""
    if name in RAW_DTYPES:
        return cast(torch.dtype, getattr(torch, name))
    return _torch_dtype_of(storage_dtype(name))


def as_tensor(array: np.ndarray, name: str) -> torch.Tensor:
    """A tensor sharing ``array``'s memory, with the dtype the tensor travelled as."""
    tensor = torch.from_numpy(array)
    return tensor.view(torch_dtype(name)) if name in RAW_DTYPES else tensor


def describe(tensor: torch.Tensor) -> tuple[str, list[int], int]:
    """``(dtype name, shape, nbytes)`` of a tensor, without copying it."""
    return _raw_name(tensor.dtype), [int(n) for n in tensor.shape], tensor.numel() * tensor.element_size()


def resident_state_dict(target: HeldWeights) -> dict[str, torch.Tensor]:
    """The resident version as a state dict of tensors that share the target's memory: every version
    ``WeightFetcher.fetch_into`` applies later shows in them, in place (the target is pinned)."""
    if target.manifest is None:
        raise RoseError("these resident weights hold no version yet: fetch_into one first")
    dtypes = {entry.name: entry.dtype for entry in target.manifest.tensors}
    target.pinned = True
    return {name: as_tensor(array, dtypes[name]) for name, array in target.arrays().items()}


def bind_module(module: torch.nn.Module, target: HeldWeights, names: Mapping[str, str] | None = None) -> list[str]:
    """Make the parameters and buffers of ``module`` views of the resident version, so every later
    version lands in the module in place (O(changes) for patches). ``names`` maps a module name to
    its name in the version (default: the same). Returns the bound names; shapes and dtypes must match.
    The target is pinned: its memory is never swapped from under the module afterwards."""
    tensors = resident_state_dict(target)
    bound = []
    with torch.no_grad():
        for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers()):
            source = tensors.get((names or {}).get(name, name))
            if source is None:
                continue
            if source.shape != tensor.shape or source.dtype != tensor.dtype:
                raise RoseError(
                    f"{name}: the version holds {source.dtype} {list(source.shape)}, the module "
                    f"{tensor.dtype} {list(tensor.shape)}: bind a module of the published model"
                )
            tensor.data = source
            bound.append(name)
    return bound


def cat_rows(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``parts`` stacked along dim 0 into one new contiguous tensor (a fused engine parameter)."""
    return torch.cat([p.detach() for p in parts], dim=0).contiguous()
