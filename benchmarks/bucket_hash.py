"""What BLAKE3 bucket checksums cost the weight path (decision 724), side by side with the xxh3 they replaced.

    python3 benchmarks/bucket_hash.py [--base REV] [--rounds 3] [--bench-args "..."] [--json]

Two parts, one invocation:
1. Each hash on one core over a 609 MB stream cut into 64 MiB buckets (the bench model's size): GB/s,
   median of 5.
2. ``rose-transfer bench --json`` (defaults: the 609 MB model, 4 receivers, TP-2 views, no link limit)
   from ``--base`` (a revision with xxh3, checked out into a temporary git worktree) and from this tree,
   alternating, ``--rounds`` times each; medians of each system's first run (what an RL step sees), the
   repeats' medians, and the speedups. Both systems of the bench pay the hash: the baseline checks every
   dense bucket, ROSE every patched one (and the publisher hashes each version and view once).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import xxhash

ROOT = Path(__file__).resolve().parents[1]
BASE_REV = "de12fcb"  # main before decision 724: xxh3-64 buckets, xxh3-128 manifest digests
MODEL_BYTES = 609 * 10**6
BUCKET = 64 << 20
KEYS = ("rose_first_seconds", "baseline_first_seconds", "first_speedup", "rose_seconds", "baseline_seconds", "speedup")


def _throughput(hasher: Any, stream: np.ndarray) -> float:
    buckets = [stream[i : i + BUCKET] for i in range(0, stream.nbytes, BUCKET)]
    times = []
    for _ in range(5):
        started = time.perf_counter()
        for bucket in buckets:
            hasher(bucket)
        times.append(time.perf_counter() - started)
    return stream.nbytes / statistics.median(times) / 1e9


def _hash_rates() -> dict[str, float]:
    stream = np.frombuffer(np.random.default_rng(0).bytes(MODEL_BYTES), dtype=np.uint8)
    return {
        "xxh3_64_gbps": _throughput(xxhash.xxh3_64_hexdigest, stream),
        "blake3_gbps": _throughput(lambda b: blake3.blake3(b).hexdigest(), stream),
    }


def _sources(tree: Path) -> str:
    return os.pathsep.join(str(tree / "packages" / p / "src") for p in ("rose-core", "rose-transfer"))


def _bench(tree: Path, args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": _sources(tree)}
    probe = "import rose_transfer.version.manifest as m; print(m.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    if not where.stdout.startswith(str(tree)):
        raise SystemExit(f"the bench would import {where.stdout.strip()}, not the tree at {tree}")
    done = subprocess.run(
        [sys.executable, "-m", "rose_transfer", "bench", "--json", *args],
        env=env, capture_output=True, text=True, check=False,
    )
    if done.returncode:
        raise SystemExit(f"rose-transfer bench failed in {tree}:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: round(statistics.median(float(r[key]) for r in runs), 3) for key in KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE_REV, help="revision with the xxh3 checksums")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench-args", default="", help="extra arguments for rose-transfer bench")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    rates = _hash_rates()
    runs: dict[str, list[dict[str, Any]]] = {"xxh3": [], "blake3": []}
    with tempfile.TemporaryDirectory(prefix="rose-hash-base-") as scratch:
        base = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), opts.base], check=True)
        try:
            for round_ in range(opts.rounds):
                for name, tree in (("xxh3", base), ("blake3", ROOT)):
                    runs[name].append(_bench(tree, shlex.split(opts.bench_args)))
                    print(f"round {round_ + 1}/{opts.rounds} {name}: first_speedup "
                          f"{runs[name][-1]['first_speedup']:.2f}", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    result = {"hash": rates, "base": opts.base, "bench_args": opts.bench_args,
              **{name: _medians(r) for name, r in runs.items()},
              "runs": {name: [{k: r[k] for k in KEYS} for r in rs] for name, rs in runs.items()}}
    if opts.json:
        print(json.dumps(result, indent=2))
        return
    print(f"one core: xxh3-64 {rates['xxh3_64_gbps']:.2f} GB/s, BLAKE3 {rates['blake3_gbps']:.2f} GB/s")
    print(f"rose-transfer bench {opts.bench_args or '(defaults)'}, medians of {opts.rounds} rounds each:")
    print(f"{'':8s}" + "".join(f"{k:>24s}" for k in KEYS))
    for name in ("xxh3", "blake3"):
        print(f"{name:8s}" + "".join(f"{result[name][k]:>24.3f}" for k in KEYS))


if __name__ == "__main__":
    main()
