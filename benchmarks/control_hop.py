"""The control plane's round trip to an executor, on its real parts: the controller's ``ControlServer`` (ROUTER)
sends a ``TurnRequest`` over TCP to an executor process whose event loop answers with a ``TurnResult`` through
``rose_executor.agent.controller_link.ControllerLink``, and the controller thread receives it. The executor answers
at once, so the figure is what the two hops of every turn cost (framing, MAC, the threads on both sides,
TCP on loopback), without an engine.

    python3 benchmarks/control_hop.py [--calls 2000] [--rounds 5] [--json]

Two executor links, side by side in one invocation, each in its own process, in alternating rounds:
``loop`` (``rose_core.transport.channel.LoopControlClient``: the DEALER owned by the executor's event loop, what
`rose-executor` uses) and ``thread`` (``ControlClient``: a Python I/O thread and an inproc pipe between the
loop and the socket, what it used before). Sequential round trips; p50 / p99 per link over all rounds, and the
per-round medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

from rose_core.protocol.messages import Hello, SamplingParams, TurnRequest, TurnResult
from rose_core.transport.channel import ControlServer

LINKS = ("loop", "thread")
PROMPT_TOKENS = 512
"""A turn's prompt as the gateway bench's sessions send it (the request's size on the wire)."""


async def _executor(address: str, secret_hex: str, link_name: str) -> None:
    from rose_core.transport.channel import ControlClient
    from rose_core.transport.loop_control_client import LoopControlClient
    from rose_executor.agent.controller_link import ControllerLink

    connect = LoopControlClient if link_name == "loop" else ControlClient
    peer = f"bench-{link_name}"
    link = ControllerLink(address, bytes.fromhex(secret_hex), peer, connect)
    link.send(Hello(peer_id=peer, kind="executor", software="control-hop bench"))
    out, logprobs = np.array([7], dtype=np.int32), np.array([-0.5], dtype=np.float32)
    while True:
        msg = await link.recv(timeout=60)
        if not isinstance(msg, TurnRequest):
            break
        link.send(TurnResult(turn_id=msg.turn_id, trajectory_id=msg.trajectory_id, attempt=msg.attempt,
                             executor_id=peer, weight_version=msg.max_version, output_token_ids=out,
                             output_logprobs=logprobs, finish_reason="length"))
    await link.close()


def _round_trips(server: ControlServer, peer: bytes, calls: int, tag: str) -> list[float]:
    prompt = np.arange(PROMPT_TOKENS, dtype=np.int32)
    sampling = SamplingParams(max_tokens=1)
    times = []
    for i in range(calls):
        turn_id = f"{tag}-{i}"
        start = time.perf_counter()
        server.send(peer, TurnRequest(turn_id=turn_id, trajectory_id="t", attempt=0, prompt_token_ids=prompt,
                                      sampling=sampling, min_version=0, max_version=0))
        while True:
            got = server.recv(timeout=10)
            if got is None:
                raise SystemExit(f"no TurnResult for {turn_id} within 10 s")
            if isinstance(got[1], TurnResult) and got[1].turn_id == turn_id:
                break
        times.append((time.perf_counter() - start) * 1000)
    return times


def _start(address: str, secret: bytes, link_name: str, server: ControlServer) -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, __file__, "--executor", link_name, "--address", address,
                              "--secret", secret.hex()])
    got = server.recv(timeout=60)
    if got is None or not isinstance(got[1], Hello):
        child.kill()
        raise SystemExit(f"the {link_name} executor did not say Hello")
    return child


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="round trips per link per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--executor", choices=LINKS, help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--secret", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.executor:
        asyncio.run(_executor(args.address, args.secret, args.executor))
        return
    secret = secrets.token_bytes(32)
    results: dict[str, dict[str, Any]] = {name: {"ms": [], "round_p50": [], "round_p99": []} for name in LINKS}
    with ControlServer("tcp://127.0.0.1:0", secret) as server:
        children = {name: _start(server.address, secret, name, server) for name in LINKS}
        try:
            for name in LINKS:  # warm-up, not counted
                _round_trips(server, f"bench-{name}".encode(), 200, f"warm-{name}")
            for r in range(args.rounds):
                order = LINKS if r % 2 == 0 else LINKS[::-1]
                for name in order:
                    ms = _round_trips(server, f"bench-{name}".encode(), args.calls, f"{name}-{r}")
                    results[name]["ms"] += ms
                    results[name]["round_p50"].append(round(_pct(ms, 50), 3))
                    results[name]["round_p99"].append(round(_pct(ms, 99), 3))
                if not args.json:
                    print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                        f"{n} p50 {results[n]['round_p50'][-1]:.3f} p99 {results[n]['round_p99'][-1]:.3f} ms"
                        for n in LINKS), flush=True)
        finally:
            for child in children.values():
                child.kill()
                child.wait()
    report = {"calls_per_round": args.calls, "rounds": args.rounds, "prompt_tokens": PROMPT_TOKENS}
    for name in LINKS:
        ms = results[name].pop("ms")
        report[name] = {"p50_ms": round(_pct(ms, 50), 3), "p99_ms": round(_pct(ms, 99), 3),
                        "mean_ms": round(statistics.fmean(ms), 3), **results[name]}
    report["p50_ratio_thread_over_loop"] = round(report["thread"]["p50_ms"] / report["loop"]["p50_ms"], 2)
    report["p99_ratio_thread_over_loop"] = round(report["thread"]["p99_ms"] / report["loop"]["p99_ms"], 2)
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
