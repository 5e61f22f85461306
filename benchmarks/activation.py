"""How long a standing serving host takes to join an RL job: its pre-deployed inactive policy activated
(``[rollout] keep_between_leases = true``) against a rollout engine started for the job (the default), in one
invocation, on real vLLM CPU engines.

    python3 benchmarks/activation.py [--leases 5] [--json]

A real `rose-executor --role serving` (the product's command) runs production; this script plays each job's
controller on a real control socket: Welcome, then the time until the host's Register (the host is ready to
take turns), then Release, Goodbye, and the host's next Hello; ``--leases`` times with the policy kept, then
as many with it started per lease. Reports the median and every sample of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

from rose_core.app.rl.demo.models import ensure_models
from rose_core.protocol.messages import Goodbye, Hello, Register, Release, Welcome
from rose_core.support.metrics import free_port
from rose_core.transport.channel import ControlServer

SECRET = b"activation-benchmark-secret-0123"


def config(work: Path, keep: bool) -> Path:
    models = ensure_models(work.parent / "models")
    path = work / "executor.toml"
    path.write_text(tomli_w.dumps({
        "kv_cache_gib": 0.5, "max_model_len": 1024, "profile_cache_dir": str(work.parent / "profiles"),
        "rollout": {"model_dir": str(models.policy), "capacity": 4, "keep_between_leases": keep},
        "serving": {"model_dir": str(models.serving), "model_name": "prod", "port": free_port()},
    }))
    return path


def wait_for(server: ControlServer, kind: type, timeout: float) -> tuple[bytes, Any]:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        got = server.recv(timeout=min(left, 0.5))
        if got is not None and isinstance(got[1], kind):
            return got
    raise TimeoutError(f"no {kind.__name__} from the serving host within {timeout:g} s")


def leases(work: Path, keep: bool, count: int) -> dict[str, Any]:
    """``count`` leases of one serving host; the seconds from each Welcome to its Register."""
    work.mkdir(parents=True)
    secret = work / "secret"
    secret.write_bytes(SECRET)
    server = ControlServer("tcp://127.0.0.1:0", SECRET)
    log = (work / "executor.log").open("w")
    command = [sys.executable, "-m", "rose_executor", "--controller", server.address, "--role", "serving",
               "--config", str(config(work, keep)), "--secret-file", str(secret), "--executor-id", "serving-0",
               "--metrics-port", "0"]
    host = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "ROSE_LEASE_DIR": str(work), "VLLM_CPU_KVCACHE_SPACE": "1"})
    samples: list[float] = []
    try:
        peer, _ = wait_for(server, Hello, 600)
        for lease in range(count):
            welcomed = time.perf_counter()
            server.send(peer, Welcome(controller_id=f"job-{lease}", heartbeat_interval_s=1.0, stall_timeout_s=30.0))
            wait_for(server, Register, 600)
            samples.append(time.perf_counter() - welcomed)
            print(f"  {'kept' if keep else 'started'} lease {lease + 1}: registered {samples[-1]:.2f} s after Welcome",
                  file=sys.stderr)
            server.send(peer, Release(reason="benchmark lease over"))
            wait_for(server, Goodbye, 120)
            peer, _ = wait_for(server, Hello, 120)
    finally:
        host.terminate()
        host.wait(120)
        server.close()
        log.close()
    return {"median_s": statistics.median(samples), "samples_s": [round(s, 3) for s in samples]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leases", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rose-activation-") as tmp:
        root = Path(tmp)
        kept = leases(root / "kept", True, args.leases)
        started = leases(root / "started", False, args.leases)
    result = {"activated": kept, "started": started, "speedup": started["median_s"] / kept["median_s"]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"pre-deployed policy activated: median {kept['median_s']:.2f} s of {args.leases} {kept['samples_s']}")
        print(f"rollout engine started:        median {started['median_s']:.2f} s of {args.leases} "
              f"{started['samples_s']}")
        print(f"activation is {result['speedup']:.1f}x faster")


if __name__ == "__main__":
    main()
