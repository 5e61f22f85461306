"""The gateway's shape with no logic in it: what the hops of a gateway call cost on this machine before ROSE
does anything (no session, template, tokeniser, scheduler, admission or engine).

    python3 benchmarks/relay_floor.py [--calls 2000] [--json]

A relay process serves the product's HTTP server (``rose_core.app.gateway.http_server.ApiServer``: the same handler,
keep-alive, bearer check) with one route that hands each call to its main thread through a future and a
``wake``, as the gateway's ``TurnBridge`` does; the main thread pumps a real ``ControlServer``, sends a
512-token ``TurnRequest`` to an executor process (``control_hop.py``'s: ``ControllerLink`` over
``LoopControlClient``, what `rose-executor` uses) that answers at once, and resolves the future with the
``TurnResult``. The client (this process, ``httpx`` as in ``gateway_overhead.py``) posts the gateway bench's
first chat body and times each call; ``/health`` on the same connection is the HTTP floor.

``gateway_overhead.py`` runs this beside the gateway in the same invocation (``relay_floor_*``): the gateway's
overhead minus this floor is what ROSE's own logic adds.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import secrets
import statistics
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import numpy as np

KEY = "relay-floor"
WARMUP = 200
FIRST_MESSAGES = [{"role": "system", "content": "You walk a frozen lake; answer with one move."},
                  {"role": "user", "content": "You stand at the start. The goal is three steps to the right."}]
"""How every session of the gateway bench starts (``gateway_overhead.py`` takes them from here)."""
BODY = {"model": "policy", "max_tokens": 1, "messages": FIRST_MESSAGES}
"""The gateway bench's first chat call."""


def serve() -> None:
    """The relay process: prints ``relay URL`` once it serves, runs until stdin closes."""
    import threading

    from control_hop import PROMPT_TOKENS

    from rose_core.app.gateway.http_server import ApiServer
    from rose_core.protocol.messages import Hello, SamplingParams, TurnRequest, TurnResult
    from rose_core.transport.channel import ControlServer

    secret = secrets.token_bytes(32)
    server = ControlServer("tcp://127.0.0.1:0", secret)
    executor = subprocess.Popen([sys.executable, str(Path(__file__).with_name("control_hop.py")), "--executor",
                                 "loop", "--address", server.address, "--secret", secret.hex()])
    got = server.recv(60)
    if got is None or not isinstance(got[1], Hello):
        executor.kill()
        raise SystemExit("the relay's executor did not say Hello")
    waiting: queue.SimpleQueue[tuple[str, Future[str]]] = queue.SimpleQueue()
    running: dict[str, Future[str]] = {}
    calls = iter(range(1 << 62))

    def relay(_target: Any, _params: dict[str, str], body: bytes) -> dict[str, Any]:
        json.loads(body)
        future: Future[str] = Future()
        waiting.put((f"r{next(calls)}", future))
        server.wake()
        return {"object": "relay", "turn_id": future.result(timeout=10)}

    api = ApiServer(None, [("POST", re.compile(r"/relay"), relay)], KEY, name="rose-relay").start()
    stopped = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stopped.set()), daemon=True).start()
    print(f"relay {api.url}", flush=True)
    prompt = np.arange(PROMPT_TOKENS, dtype=np.int32)
    sampling = SamplingParams(max_tokens=1)
    try:
        while not stopped.is_set():
            item = server.recv(0.05)
            while item is not None:
                if isinstance(item[1], TurnResult):
                    running.pop(item[1].turn_id).set_result(item[1].turn_id)
                item = server.recv(0)
            while True:
                try:
                    turn_id, future = waiting.get_nowait()
                except queue.Empty:
                    break
                running[turn_id] = future
                server.send(b"bench-loop", TurnRequest(turn_id=turn_id, trajectory_id="relay", attempt=0,
                                                       prompt_token_ids=prompt, sampling=sampling,
                                                       min_version=0, max_version=0))
    finally:
        executor.kill()
        executor.wait()
        api.close()
        server.close()


def start() -> tuple[subprocess.Popen[str], str]:
    """The relay process and its URL."""
    proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("relay "):
            return proc, line.split()[1]
    proc.kill()
    raise SystemExit("the relay process ended before it served")


def stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(url: str, calls: int) -> list[float]:
    """``calls`` sequential relay calls (after a warm-up) on one keep-alive connection: each latency in ms."""
    http = httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    times = []
    for i in range(WARMUP + calls):
        t0 = time.perf_counter()
        resp = http.post(f"{url}/relay", json=BODY)
        resp.json()
        if resp.status_code != 200:
            raise SystemExit(f"relay call failed: {resp.status_code} {resp.text[:200]}")
        if i >= WARMUP:
            times.append(1e3 * (time.perf_counter() - t0))
    return times


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile as the gateway bench takes it (``gateway_overhead.py`` uses this one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def floor(calls: int) -> dict[str, float]:
    """Start the relay, time ``calls`` calls, stop it: ``relay_floor_p50_ms`` / ``relay_floor_p99_ms``."""
    proc, url = start()
    try:
        times = measure(url, calls)
    finally:
        stop(proc)
    return {"relay_floor_p50_ms": round(statistics.median(times), 3),
            "relay_floor_p99_ms": round(percentile(times, 0.99), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    result = floor(args.calls)
    if args.json:
        print(json.dumps(result))
        return
    print(f"relay floor ({args.calls} calls): p50 {result['relay_floor_p50_ms']:.2f} ms, "
          f"p99 {result['relay_floor_p99_ms']:.2f} ms")


if __name__ == "__main__":
    main()
