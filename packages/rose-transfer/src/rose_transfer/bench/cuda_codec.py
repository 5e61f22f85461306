"""The sparse codec on device tensors (torch; Triton kernels on CUDA when Triton is installed).

A patch of ``new`` against ``old`` is the sorted positions of the changed elements (compared as raw
integer words, so NaN payloads and -0.0 are exact) and the NEW words there: the receiver overwrites,
never adds, so the result is bit-exact. ``encode`` picks:

- ``triton`` (CUDA + Triton): one fused pass reads ``old`` and ``new`` once; each program compares one
  block, compacts its changed positions and values with an in-block prefix sum into a per-block
  staging slot and writes its count; a ``cumsum`` over block counts gives each block's output offset
  and a second tiny kernel moves the staged changes into place. No ``nonzero`` and no atomics, so the
  output is ordered exactly as the numpy codec's positions. A block with more changes than its slot
  makes the caller fall back to ``torch`` (such a bucket would travel dense anyway).
- ``torch`` (any device): ``(old != new).nonzero()`` on integer views plus a gather (the naive path).

This module imports only torch (and Triton when present): it loads on machines without CUDA and
without the rest of rose (``benchmarks/gpu/codec_bench.py`` loads it by file path), so it imports
torch itself rather than through ``version.torch_tensors``."""

# No ``from __future__ import annotations`` here: Triton reads the kernels' ``tl.constexpr`` annotations.
import logging
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)
triton_error = ""  # why the Triton path was given up, if it was
_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
BLOCK = 4096
"""Elements compared per Triton program (8 warps). On an H200, 2^30 bf16 elements with 1% changed
(``benchmarks/gpu/codec_bench.py --block-sweep``, 2026-12-04): 1024 -> 3.66 ms, 2048 -> 3.15, 4096 -> 2.83,
8192 -> 4.1, 16384 -> 5.32 (the in-block prefix sum dominates past 4096)."""
SLOT = BLOCK // 8  # changes one block may stage (12.5%); more -> torch fallback
STAGE_WARPS = 8  # warps per program of the compare-and-stage kernel


@dataclass(slots=True, frozen=True)
class DevicePatch:
    """Sorted positions (int64) of the changed words of a flat tensor and their new words."""

    numel: int
    positions: Any  # torch.Tensor, int64
    values: Any  # torch.Tensor, integer words
    method: str = "torch"

    @property
    def wire_bytes(self) -> int:
        return int(self.positions.numel() * 4 + self.values.numel() * self.values.element_size())


def words(t: Any) -> Any:
    """A flat integer view of ``t``'s bits (bf16/fp16 -> int16, fp32 -> int32)."""
    flat = t.contiguous().reshape(-1)
    size = flat.element_size()
    if size not in _WORDS:
        raise ValueError(f"tensors of {size}-byte elements cannot be patched: use 1, 2, 4 or 8-byte dtypes")
    return flat if flat.dtype == _WORDS[size] else flat.view(_WORDS[size])


def encode_torch(old: Any, new: Any) -> DevicePatch:
    """The naive patch: compare, ``nonzero`` (a host sync), gather."""
    a, b = _checked(old, new)
    positions = (a != b).nonzero().reshape(-1)
    return DevicePatch(b.numel(), positions, b[positions], "torch")


def encode(old: Any, new: Any) -> DevicePatch:
    """The patch turning ``old`` into ``new`` (same shape and dtype, any device)."""
    global triton_error
    a, b = _checked(old, new)
    if a.is_cuda and triton_ready() and not triton_error:
        try:
            patch = _encode_triton(a, b)
        except Exception as exc:  # a kernel that fails to build or run: say so once, use torch
            triton_error = f"{type(exc).__name__}: {exc}"
            log.warning("the Triton codec failed (%s); encoding with torch", triton_error)
            patch = None
        if patch is not None:
            return patch
    return encode_torch(a, b)


def decode(base: Any, patch: DevicePatch, out: Any = None) -> Any:
    """``base`` with the patch applied, into ``out`` (a new tensor if None; may be ``base`` itself)."""
    if base.numel() != patch.numel:
        raise ValueError(f"patch is for {patch.numel} elements, the base has {base.numel()}")
    if out is None:
        target = base.clone()
    elif out is not base:
        if out.numel() != base.numel() or out.dtype != base.dtype:
            raise ValueError("out must match the base in size and dtype")
        target = out.copy_(base)
    else:
        target = base
    flat = words(target)
    if flat.data_ptr() != target.data_ptr():
        raise ValueError("out must be contiguous")
    flat.index_copy_(0, patch.positions, patch.values)
    return target


def _checked(old: Any, new: Any) -> tuple[Any, Any]:
    if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
        raise ValueError(
            f"old and new differ: {old.shape}/{old.dtype}/{old.device} vs {new.shape}/{new.dtype}/{new.device}"
        )
    return words(old), words(new)


# ---------------------------------------------------------------- Triton path

try:  # kernels are defined at module level: Triton resolves ``tl`` through the kernel's globals
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # optional: the torch path encodes without it
    HAVE_TRITON = False


def triton_ready() -> bool:
    """Whether the Triton kernels can run (Triton importable and a CUDA device present)."""
    return HAVE_TRITON and torch.cuda.is_available()


if HAVE_TRITON:

    @triton.jit  # type: ignore[untyped-decorator]
    def _stage(old_ptr, new_ptr, pos_ptr, val_ptr, count_ptr, n, BLOCK: tl.constexpr, SLOT: tl.constexpr):  # type: ignore[no-untyped-def]
        """Compare one block; stage its changed positions and new values (in order) in its slot."""
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        a = tl.load(old_ptr + offs, mask=inside, other=0)
        b = tl.load(new_ptr + offs, mask=inside, other=0)
        changed = (a != b) & inside
        flags = changed.to(tl.int32)
        count = tl.sum(flags, axis=0)
        slot = tl.cumsum(flags, axis=0) - flags
        keep = changed & (slot < SLOT)
        dst = pid.to(tl.int64) * SLOT + slot
        tl.store(pos_ptr + dst, offs, mask=keep)
        tl.store(val_ptr + dst, b, mask=keep)
        tl.store(count_ptr + pid, count)

    @triton.jit  # type: ignore[untyped-decorator]
    def _gather(pos_ptr, val_ptr, count_ptr, start_ptr, out_pos_ptr, out_val_ptr, SLOT: tl.constexpr):  # type: ignore[no-untyped-def]
        """Move one block's staged changes to its place in the output."""
        pid = tl.program_id(0)
        count = tl.load(count_ptr + pid)
        start = tl.load(start_ptr + pid)
        i = tl.arange(0, SLOT)
        live = i < count
        src = pid.to(tl.int64) * SLOT + i
        tl.store(out_pos_ptr + start + i, tl.load(pos_ptr + src, mask=live), mask=live)
        tl.store(out_val_ptr + start + i, tl.load(val_ptr + src, mask=live), mask=live)


def _encode_triton(a: Any, b: Any) -> DevicePatch | None:
    n = b.numel()
    blocks = max(1, -(-n // BLOCK))
    staged_pos = torch.empty(blocks * SLOT, dtype=torch.int64, device=b.device)
    staged_val = torch.empty(blocks * SLOT, dtype=b.dtype, device=b.device)
    counts = torch.empty(blocks, dtype=torch.int32, device=b.device)
    _stage[(blocks,)](a, b, staged_pos, staged_val, counts, n, BLOCK=BLOCK, SLOT=SLOT, num_warps=STAGE_WARPS)
    ends = torch.cumsum(counts, 0)
    total, widest = (int(x) for x in torch.stack([ends[-1].to(torch.int64), counts.max().to(torch.int64)]).tolist())
    if widest > SLOT:
        return None
    positions = torch.empty(total, dtype=torch.int64, device=b.device)
    values = torch.empty(total, dtype=b.dtype, device=b.device)
    _gather[(blocks,)](staged_pos, staged_val, counts, ends - counts, positions, values, SLOT=SLOT, num_warps=4)
    return DevicePatch(n, positions, values, "triton")
