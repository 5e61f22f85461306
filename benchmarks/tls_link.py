"""What TLS costs the weight links (``[controller] weights_tls``): one publisher serving plain TCP and one
serving TLS, the same version fetched whole from each in turn by a receiver on this host, alternating so
both see the same machine state; medians and the ratio.

    python3 benchmarks/tls_link.py [--mb 600] [--repeats 5] [--json]

Loopback, so this is the CPU cost of the encryption (OpenSSL AES-GCM in the event loop's thread, both ends
on this machine's cores) with no network in the way: an upper bound on what TLS adds over a real link,
where the wire is usually the slower part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from rose_transfer import DensePublisher, WeightFetcher

SECRET = b"tls-link-benchmark-secret-0123456789"
TENSOR_MB = 64


def _tensors(mb: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    count = max(1, mb // TENSOR_MB)
    return {f"layer{i}.weight": rng.integers(0, 255, TENSOR_MB << 20, dtype=np.uint8) for i in range(count)}


async def _fetch_once(announce, dest: Path) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    await WeightFetcher(SECRET, "bench").fetch(announce, -1, dest)
    seconds = time.perf_counter() - started
    dest.unlink()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=600, help="Model size in MB (64 MB tensors).")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tensors = _tensors(args.mb)
    total = sum(t.nbytes for t in tensors.values())
    times: dict[str, list[float]] = {"tcp": [], "tls": []}
    with tempfile.TemporaryDirectory(dir="/dev/shm") as work, \
            DensePublisher(secret=SECRET, host="127.0.0.1", port=0) as plain, \
            DensePublisher(secret=SECRET, host="127.0.0.1", port=0, tls=True) as encrypted:
        announces = {"tcp": plain.publish(1, 0, tensors), "tls": encrypted.publish(1, 0, tensors)}
        for _ in range(args.repeats):
            for scheme, announce in announces.items():
                times[scheme].append(asyncio.run(_fetch_once(announce, Path(work, f"{scheme}.bin"))))
    result = {
        "bytes": total,
        "repeats": args.repeats,
        **{f"{scheme}_seconds_median": statistics.median(values) for scheme, values in times.items()},
        **{f"{scheme}_gbps_median": total * 8 / statistics.median(values) / 1e9 for scheme, values in times.items()},
        "tls_over_tcp": statistics.median(times["tls"]) / statistics.median(times["tcp"]),
        "seconds": times,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for scheme in ("tcp", "tls"):
        print(f"{scheme}: {total / 1e6:.0f} MB in {result[f'{scheme}_seconds_median']:.3f} s median "
              f"({result[f'{scheme}_gbps_median']:.1f} Gbit/s) over {args.repeats}")
    print(f"tls / tcp: {result['tls_over_tcp']:.2f}x")


if __name__ == "__main__":
    main()
