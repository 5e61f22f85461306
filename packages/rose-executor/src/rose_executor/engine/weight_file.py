"""Flat weight-version files: one file of raw tensor bytes plus ``TensorEntry`` records locating them.

rose-transfer writes a fetched version in this layout; ``flat_file_from_safetensors`` builds the same layout
from a Hugging Face checkpoint (to apply a local checkpoint, or to test reloads without a transfer).
"""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from rose_core.errors import RoseError
from rose_core.messages import TensorEntry

SAFETENSORS_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "I8": "int8",
    "U8": "uint8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "BOOL": "bool",
}
_ALIGN = 64


def stage_dir(name: str) -> Path:
    """A private directory for staged weight files: /dev/shm when the host has it, else the temp dir."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    path = root / f"rose-{name}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def flat_file_from_safetensors(sources: Path | list[Path], dest: Path) -> list[TensorEntry]:
    """Copy every tensor of the safetensors file(s) ``sources`` into the flat file ``dest``."""
    if isinstance(sources, list):
        files = [Path(s) for s in sources]
    elif sources.is_dir():
        files = sorted(sources.glob("*.safetensors"))
    else:
        files = [sources]
    if not files:
        raise RoseError(f"no .safetensors files in {sources}: point at a Hugging Face checkpoint directory")
    entries: list[TensorEntry] = []
    offset = 0
    with open(dest, "wb") as out:
        for file in files:
            offset = _copy_tensors(file, out, offset, entries)
    return entries


def read_safetensors_header(file: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and the offset where its tensor bytes start."""
    with open(file, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(length))
    return header, 8 + length


def _copy_tensors(file: Path, out: BinaryIO, offset: int, entries: list[TensorEntry]) -> int:
    header, data_start = read_safetensors_header(file)
    with open(file, "rb") as f:
        for name, info in sorted(header.items()):
            if name == "__metadata__":
                continue
            dtype = SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise RoseError(f"{file}: tensor {name} has unsupported dtype {info['dtype']}")
            begin, end = info["data_offsets"]
            f.seek(data_start + begin)
            padding = (-offset) % _ALIGN
            out.write(b"\0" * padding)
            offset += padding
            out.write(f.read(end - begin))
            entries.append(
                TensorEntry(name=name, dtype=dtype, shape=list(info["shape"]), offset=offset, nbytes=end - begin)
            )
            offset += end - begin
    return offset
