"""GPU sparse-codec benchmark: 2^30 bf16 elements, 1% changed, on one CUDA device.

Run from the repository root (no rose package needs to be installed; only torch, Triton optional):

    python benchmarks/gpu/codec_bench.py [--elements 1073741824] [--changed 0.01] [--runs 10]

It loads ``packages/rose-transfer/src/rose_transfer/bench/cuda_codec.py`` by file path (so neither rose_core
nor msgspec is imported) and measures, as effective GB/s = model bytes (elements x 2) / seconds, the
median of ``--runs`` timed runs after warm-up, timed with CUDA events:

- ``naive_encode``: ``(old != new).nonzero()`` + gather on the bf16 tensors, as in the reference figure;
- ``torch_encode``: the same on int16 views (``cuda_codec.encode_torch``);
- ``encode``: ``cuda_codec.encode`` (fused Triton compare+compaction when Triton is present);
- ``decode_in_place``: scatter of the new values into a copy of the base (the copy not timed);
- ``decode_new``: clone of the base + scatter (a new buffer);
- ``copy``: ``dst.copy_(src)`` of the model bytes (the ceiling).

It checks bit-exactness of every path (positions equal the naive ones, decode equals ``new`` bit for
bit), prints one JSON line and writes it to ``$OUT/gpu_codec.json`` when ``$OUT`` is set."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
CODEC_PATH = ROOT / "packages/rose-transfer/src/rose_transfer/bench/cuda_codec.py"


def load_codec() -> Any:
    spec = importlib.util.spec_from_file_location("rose_cuda_codec", CODEC_PATH)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {CODEC_PATH}: run from a rose checkout")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


def make_versions(n: int, changed: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    old = (torch.randn(n, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    new = old.clone()
    picked = torch.rand(n, device="cuda", generator=gen) < changed
    bump = torch.where(old[picked].view(torch.int16) == 0, 1, -1).to(torch.int16)
    new.view(torch.int16)[picked] = old.view(torch.int16)[picked] + bump  # a one-ulp change: surely different
    del picked
    torch.cuda.synchronize()
    return old, new


def timed(fn: Any, runs: int, warmup: int = 2, setup: Any = None) -> float:
    """Median seconds of ``fn()`` over ``runs`` (CUDA events), after ``warmup`` calls."""
    times = []
    for i in range(warmup + runs):
        state = setup() if setup is not None else None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn(state) if setup is not None else fn()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def naive_encode(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    positions = (old != new).nonzero().reshape(-1)
    return positions, new[positions]


def run(args: argparse.Namespace) -> dict[str, Any]:
    codec = load_codec()
    n = args.elements
    old, new = make_versions(n, args.changed, args.seed)
    model_bytes = n * old.element_size()
    naive_pos, _ = naive_encode(old, new)
    patch = codec.encode(old, new)
    torch_patch = codec.encode_torch(old, new)
    exact = bool(torch.equal(patch.positions, naive_pos) and torch.equal(torch_patch.positions, naive_pos))
    decoded = codec.decode(old, patch)
    exact = exact and bool(torch.equal(decoded.view(torch.int16), new.view(torch.int16)))
    del decoded
    dst = torch.empty_like(old)
    seconds = {
        "naive_encode": timed(lambda: naive_encode(old, new), args.runs),
        "torch_encode": timed(lambda: codec.encode_torch(old, new), args.runs),
        "encode": timed(lambda: codec.encode(old, new), args.runs),
        "decode_in_place": timed(
            lambda base: codec.decode(base, patch, out=base), args.runs, setup=lambda: dst.copy_(old)
        ),
        "decode_new": timed(lambda: codec.decode(old, patch), args.runs),
        "copy": timed(lambda: dst.copy_(new), args.runs),
    }
    by_block = sweep_blocks(codec, old, new, naive_pos, args) if args.block_sweep and patch.method == "triton" else {}
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": codec.triton_ready(),
        "encode_method": patch.method,
        "triton_error": codec.triton_error,
        "elements": n,
        "changed_fraction": patch.positions.numel() / n,
        "model_bytes": model_bytes,
        "patch_bytes": patch.wire_bytes,
        "bit_exact": exact,
        "seconds": seconds,
        "gbps": {name: model_bytes / s / 1e9 for name, s in seconds.items()},
        "runs": args.runs,
        "encode_by_block": by_block,
    }


def sweep_blocks(codec: Any, old: torch.Tensor, new: torch.Tensor, naive_pos: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """The Triton encode at other shapes (``--block-sweep BLOCK[:WARPS],...``; each slot stays an eighth of its
    block; warps default to the module's): median seconds, effective GB/s and bit-exactness per shape. The
    module's constants are restored after."""
    saved = codec.BLOCK, codec.SLOT, codec.STAGE_WARPS
    out: dict[str, Any] = {}
    try:
        for spec in args.block_sweep.split(","):
            block, _, warps = spec.partition(":")
            codec.BLOCK, codec.SLOT = int(block), int(block) // 8
            codec.STAGE_WARPS = int(warps) if warps else saved[2]
            patch = codec.encode(old, new)
            exact = patch.method == "triton" and bool(torch.equal(patch.positions, naive_pos))
            s = timed(lambda: codec.encode(old, new), args.runs)
            out[spec] = {"seconds": s, "gbps": old.numel() * old.element_size() / s / 1e9, "bit_exact": exact}
    finally:
        codec.BLOCK, codec.SLOT, codec.STAGE_WARPS = saved
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 30)
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-sweep", default="", help="comma-separated Triton block sizes to time too")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("codec_bench needs a CUDA device (torch.cuda.is_available() is False)")
    result = run(args)
    line = json.dumps(result)
    print(line)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_codec.json").write_text(line + "\n")
    if not result["bit_exact"]:
        raise SystemExit("the GPU codec is NOT bit-exact")


if __name__ == "__main__":
    main()
