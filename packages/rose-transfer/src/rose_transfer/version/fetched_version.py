"""A weight version received whole into a file, and how to read its tensors back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rose_core.protocol.messages import TensorEntry
from rose_transfer.version.manifest import tensor_views

if TYPE_CHECKING:
    from rose_transfer.version.torch_tensors import Tensor


@dataclass(slots=True)
class FetchedVersion:
    """``path`` holds the version's flat byte stream; ``entries`` say where each tensor sits in it."""

    version: int
    path: Path
    entries: list[TensorEntry]
    bytes_received: int
    seconds: float
    digest: str = ""


def load_arrays(fetched: FetchedVersion) -> dict[str, np.ndarray]:
    """Each tensor as a numpy array mapped copy-on-write from the file (writes never reach the file).
    bfloat16 tensors come as their int16 bits, float8 as uint8."""
    if not fetched.entries:
        return {}
    size = fetched.path.stat().st_size
    stream = np.memmap(fetched.path, dtype=np.uint8, mode="c", shape=(size,)) if size else np.empty(0, np.uint8)
    return tensor_views(stream, fetched.entries)


def load_tensors(fetched: FetchedVersion) -> list[tuple[str, Tensor]]:
    """``(name, tensor)`` pairs of a fetched version, mapped copy-on-write from its file (the
    ``[torch]`` extra; tensors carry the dtype they travelled as, bfloat16 included)."""
    from rose_transfer.version.torch_tensors import as_tensor

    dtypes = {entry.name: entry.dtype for entry in fetched.entries}
    return [(name, as_tensor(array, dtypes[name])) for name, array in load_arrays(fetched).items()]


@dataclass(slots=True, frozen=True)
class FetchedInMemory:
    """A version applied to ``ResidentWeights``: bytes received, seconds, buckets patched in place."""

    version: int
    bytes_received: int
    seconds: float
    patched_buckets: int
