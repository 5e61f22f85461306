"""msgpack encoding of protocol messages with bulk arrays as extra zero-copy frames.

``encode(msg)`` returns ``[header, *buffers]``: the header is msgpack; every numpy array (and every
torch tensor, when torch is already loaded) larger than ``inline_limit`` bytes is replaced in the header
by ``[dtype, shape, index]`` and its memory is appended as a frame without copying. Smaller arrays travel
inline as ``[dtype, shape, bytes]``. Nothing is ever pickled.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from rose_core.protocol.messages import AnyMessage
from rose_core.support.errors import ProtocolError

INLINE_LIMIT = 256
_BF16 = "bfloat16"


def _as_numpy(obj: Any) -> tuple[np.ndarray, str] | None:
    if isinstance(obj, np.ndarray):
        arr = obj if obj.flags.c_contiguous else obj.copy(order="C")
        if arr.dtype.hasobject or arr.dtype.byteorder == ">":
            raise NotImplementedError(f"arrays of {arr.dtype} cannot go on the wire")
        return arr, arr.dtype.str
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy(), _BF16
        arr = t.numpy()
        return arr, arr.dtype.str
    return None


class Encoder:
    """Encodes messages; not thread-safe (one per sending thread)."""

    def __init__(self, inline_limit: int = INLINE_LIMIT) -> None:
        self._inline_limit = inline_limit
        self._frames: list[Any] = []
        self._enc = msgspec.msgpack.Encoder(enc_hook=self._hook)

    def encode(self, msg: msgspec.Struct) -> list[Any]:
        self._frames = [b""]
        try:
            self._frames[0] = self._enc.encode(msg)
            return self._frames
        finally:
            self._frames = []

    def _hook(self, obj: Any) -> Any:
        found = _as_numpy(obj)
        if found is None:
            raise NotImplementedError(f"cannot put {type(obj).__name__} on the wire")
        arr, dtype = found
        shape = list(arr.shape)
        if arr.nbytes <= self._inline_limit:
            return [dtype, shape, arr.tobytes()]
        self._frames.append(arr.data.cast("B") if arr.ndim else arr.tobytes())
        return [dtype, shape, len(self._frames) - 1]


class Decoder:
    """Decodes ``[header, *buffers]`` into one of ``type_``; not thread-safe."""

    def __init__(self, type_: Any = AnyMessage) -> None:
        self._buffers: Sequence[Any] = ()
        self._dec = msgspec.msgpack.Decoder(type_, dec_hook=self._hook)
        self._tag_dec = msgspec.msgpack.Decoder(_TagOnly)
        self._known = _known_tags(type_)

    def decode(self, frames: Sequence[Any]) -> Any:
        if not frames:
            raise ProtocolError("malformed", "empty message")
        self._buffers = frames
        try:
            return self._dec.decode(frames[0])
        except msgspec.ValidationError as exc:
            raise ProtocolError(self._classify(frames[0]), f"invalid message: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ProtocolError("malformed", f"undecodable message: {exc}") from exc
        finally:
            self._buffers = ()

    def _classify(self, header: Any) -> str:
        try:
            tag = self._tag_dec.decode(header).type
        except (msgspec.ValidationError, msgspec.DecodeError):
            return "malformed"
        return "malformed" if tag in self._known else "unknown_type"

    def _hook(self, type_: type, obj: Any) -> Any:
        if type_ is not np.ndarray:
            raise NotImplementedError(f"no decoder for {type_}")
        if not (isinstance(obj, list) and len(obj) == 3):
            raise ValueError("expected an array reference [dtype, shape, data]")
        dtype_name, shape, data = obj
        if isinstance(data, int):
            if not 0 < data < len(self._buffers):
                raise ValueError(f"array frame {data} is missing")
            data = self._buffers[data]
        dtype = np.dtype(np.int16) if dtype_name == _BF16 else np.dtype(dtype_name)
        if dtype.hasobject:
            raise ValueError("object arrays are not allowed")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * dtype.itemsize != memoryview(data).nbytes:
            raise ValueError(f"array of {shape} {dtype_name} does not match its {memoryview(data).nbytes} bytes")
        return np.frombuffer(data, dtype=dtype).reshape(shape)


class _TagOnly(msgspec.Struct):
    type: str = ""


def _known_tags(type_: Any) -> set[str]:
    members = getattr(type_, "__args__", (type_,))
    tags: set[str] = set()
    for member in members:
        tags.update(_known_tags(member) if hasattr(member, "__args__") else {_tag_of(member)})
    return tags


def _tag_of(cls: Any) -> str:
    info = msgspec.inspect.type_info(cls)
    return str(getattr(info, "tag", ""))


def encode(msg: msgspec.Struct) -> list[Any]:
    """One-shot helper; prefer an ``Encoder`` per thread on hot paths."""
    return Encoder().encode(msg)


def decode(frames: Sequence[Any], type_: Any = AnyMessage) -> Any:
    return Decoder(type_).decode(frames)
