"""Issue 32's device check, torch alone (no vLLM): two things only a GPU can show.

1. **Start-up and fork.** vLLM forks its engine cores. A parent that asked the CUDA runtime for the device
   count (``torch.cuda.is_available()`` without ``PYTORCH_NVML_BASED_CUDA_CHECK=1``: what the executor did
   before decision 832) leaves a forked child unable to use CUDA; the executor's start-up now
   (``rose_executor.host.device.resolve_device("auto")``: NVML) leaves it able to. Each order runs in a fresh
   Python process that forks one child which allocates on the GPU; the child's outcome is reported.
2. **An in-place commit into CUDA parameters** from pinned host memory, as ``EngineWeights`` does on a GPU
   (``_copy_into`` per changed tensor, then ``_verify``: a byte sum taken on the device): bytes and seconds for
   a whole version and for a patch touching 1% of the tensors.

Prints one JSON object. On a host without CUDA it runs the CPU parts (the commit path on CPU tensors, small)
and says that the fork check needs a GPU: ``tests/executor/test_device_startup_check.py`` runs it so in CI.

    python3 benchmarks/gpu/startup_check.py [--mib 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

OLD_ORDER = "import torch; torch.cuda.is_available()"
NEW_ORDER = "from rose_executor.host.device import resolve_device; resolve_device('auto')"
CHILD = """
import os, sys
{parent}
pid = os.fork()
if pid == 0:
    try:
        import torch
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        os._exit(0)
    except Exception as exc:
        sys.stderr.write(repr(exc)[:300])
        os._exit(3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def fork_after(parent: str) -> dict[str, Any]:
    """Run ``parent`` then fork a child that uses CUDA, in a fresh interpreter (nothing initialised before)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    done = subprocess.run([sys.executable, "-c", CHILD.format(parent=parent)], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    return {"parent": parent, "child_used_cuda": done.returncode == 0, "child_error": done.stderr.strip()[-300:]}


def commit_bench(device: str, mib: int, repeats: int = 5) -> dict[str, Any]:
    """A version of ``mib`` MiB in 100 bf16 tensors: copied whole, then 1% of the tensors, into parameters on
    ``device`` from pinned host memory, each copy checked where it lives; medians of ``repeats``."""
    import torch

    from rose_executor.weights import engine_weights

    count, elements = 100, mib * (1 << 20) // 2 // 100
    pin = device != "cpu"
    stream = [torch.randn(elements).to(torch.bfloat16) for _ in range(count)]
    stream = [t.pin_memory() for t in stream] if pin else stream
    params = [torch.empty_like(t, device=device) for t in stream]

    def one(touched: int) -> float:
        sync = torch.cuda.synchronize if pin else (lambda: None)
        sync()
        started = time.perf_counter()
        for param, view in zip(params[:touched], stream[:touched], strict=True):
            engine_weights._copy_into(param, view)
        sync()
        for param, view in zip(params[:touched], stream[:touched], strict=True):
            assert engine_weights._byte_sum(param) == engine_weights._byte_sum(view), "a copy did not land"
        return time.perf_counter() - started

    out: dict[str, Any] = {"device": device, "version_bytes": sum(t.numel() * 2 for t in stream)}
    for name, touched in (("whole", count), ("patch_1pct", 1)):
        seconds = sorted(one(touched) for _ in range(repeats))[repeats // 2]
        moved = touched * elements * 2
        out[name] = {"bytes": moved, "seconds": round(seconds, 6), "gb_per_s": round(moved / seconds / 1e9, 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="the version's size on a GPU (CPU: 16)")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.device_count() > 0  # NVML: this process forks nothing
    report: dict[str, Any] = {"torch": torch.__version__, "cuda": gpu}
    if gpu:
        report["fork"] = {"old_order": fork_after(OLD_ORDER), "new_order": fork_after(NEW_ORDER)}
        report["fork"]["ok"] = (not report["fork"]["old_order"]["child_used_cuda"]
                                and report["fork"]["new_order"]["child_used_cuda"])
    else:
        report["fork"] = {"skipped": "needs an NVIDIA GPU"}
    report["commit"] = commit_bench("cuda" if gpu else "cpu", args.mib if gpu else 16)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
