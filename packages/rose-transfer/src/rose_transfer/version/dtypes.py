"""Element types of weight tensors: the name a tensor travels under and the numpy dtype that holds its bytes.

Names are numpy's (``float32``, ``int64``, ...) plus the torch types numpy lacks (``bfloat16``, the float8
types). Those travel as their raw bits: ``bfloat16`` is held as ``int16`` (as ``rose_core.protocol.serde`` does),
float8 as ``uint8``. Only little-endian layouts travel.
"""

from __future__ import annotations

import numpy as np

from rose_core.support.errors import RoseError

RAW_DTYPES: dict[str, np.dtype] = {
    "bfloat16": np.dtype(np.int16),
    "float8_e4m3fn": np.dtype(np.uint8),
    "float8_e5m2": np.dtype(np.uint8),
}
_NUMERIC_KINDS = "biufc"


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype that holds the bytes of a tensor travelling as ``name``."""
    raw = RAW_DTYPES.get(name)
    if raw is not None:
        return raw
    try:
        dtype = np.dtype(name)
    except TypeError as exc:
        raise RoseError(f"unknown tensor dtype {name!r}: the publisher runs a newer rose-transfer; upgrade") from exc
    if dtype.kind not in _NUMERIC_KINDS:
        raise RoseError(f"tensor dtype {name!r} cannot travel: only numeric tensors are weights")
    return dtype.newbyteorder("<")


def travel_dtype(dtype: np.dtype) -> tuple[np.dtype, str]:
    """The storage dtype and the travelling name of arrays of ``dtype``."""
    raw = RAW_DTYPES.get(dtype.name)
    if raw is not None and raw.itemsize == dtype.itemsize:  # e.g. ml_dtypes.bfloat16
        return raw, dtype.name
    if dtype.kind not in _NUMERIC_KINDS:
        raise RoseError(f"cannot publish a tensor of dtype {dtype}: only numeric tensors are weights")
    return dtype.newbyteorder("<"), dtype.name


def numpy_travel_form(array: np.ndarray) -> tuple[np.ndarray, str]:
    """``array`` as a C-contiguous little-endian array of its storage dtype, and its dtype name."""
    storage, name = travel_dtype(array.dtype)
    if storage.kind != array.dtype.kind:
        return np.ascontiguousarray(array).view(storage), name
    return np.ascontiguousarray(array, dtype=storage), name
