"""Methods ROSE adds to every vLLM worker (``worker_extension_cls``); this module must not import vllm.

vLLM mixes ``RoseWorkerExtension`` into its worker class, so ``self`` is the worker and
``AsyncLLM.collective_rpc("rose_reload", args=(path, entries))`` runs ``rose_reload`` in each worker
process. Tensors passed as RPC arguments would arrive as Python lists, so the bytes travel in a flat file
(normally under /dev/shm) and only its path and entries ``[name, dtype, shape, offset, nbytes]`` go
through the RPC.
"""

from __future__ import annotations

import contextlib
import mmap
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
# Types without a plain integer twin in the file travel as raw bits of this width.
_RAW_BITS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def tensors_from_buffer(buffer: Any, entries: Sequence[Sequence[Any]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Zero-copy tensor views of ``buffer`` for each entry ``[name, dtype, shape, offset, nbytes]``."""
    for name, dtype_name, shape, offset, nbytes in entries:
        dtype = TORCH_DTYPES.get(str(dtype_name))
        if dtype is None:
            raise ValueError(f"tensor {name}: unsupported dtype {dtype_name!r}; use one of {sorted(TORCH_DTYPES)}")
        dims = [int(d) for d in shape]
        if int(nbytes) == 0:
            yield str(name), torch.empty(dims, dtype=dtype)
            continue
        # bf16 travels as raw 2-byte values: read them as int16 and reinterpret (float8 likewise as uint8).
        read_as = _RAW_BITS.get(dtype, dtype)
        itemsize = torch.empty((), dtype=read_as).element_size()
        count = int(nbytes) // itemsize
        flat = torch.frombuffer(buffer, dtype=read_as, count=count, offset=int(offset))
        if read_as is not dtype:
            flat = flat.view(dtype)
        yield str(name), flat.reshape(dims)


class RoseWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    def rose_reload(self, path: str, entries: list[list[Any]]) -> dict[str, float]:
        """Apply the weight version in the flat file at ``path`` in place; returns what was loaded."""
        started = time.perf_counter()
        with open(path, "rb") as f:
            # A private copy-on-write map is writable (torch.frombuffer wants that) and never writes back.
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        try:
            self.reload_weights(weights_iterator=tensors_from_buffer(mapped, entries))  # type: ignore[attr-defined]
        finally:
            _close_quietly(mapped)
        total = float(sum(int(e[4]) for e in entries))
        return {"tensors": float(len(entries)), "bytes": total, "seconds": time.perf_counter() - started}


def _close_quietly(mapped: mmap.mmap) -> None:
    # BufferError: a tensor view is still alive somewhere; the map goes when it does.
    with contextlib.suppress(BufferError):
        mapped.close()
