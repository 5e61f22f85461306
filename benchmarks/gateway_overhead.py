"""The rollout gateway's overhead on the product path: `rose run --env gateway` (a real controller, a real
`rose-executor` with its vLLM CPU engine) driven by HTTP clients, each call measured against the engine call
it caused, side by side in the same call.

    python3 benchmarks/gateway_overhead.py [--calls 1000] [--turns 5] [--clients 16] [--seconds 20] [--json]

Per call, the client's latency (request sent -> response read, keep-alive connection) minus the executor's
own engine time (``rose_timing.engine_s``: the ``engine.generate`` call, what calling the engine directly
costs) and admission wait (``rose_timing.queue_s``, ~0 on an idle dedicated executor) is the gateway path's added
latency: HTTP, session bookkeeping and tokenising, the hand-off to the controller, routing, the control-plane
hops both ways and the executor's bookkeeping. Sequential calls (``--calls``, in sessions of ``--turns``
chat turns with a growing history) give p50 / p99 of it (target: p99 <= 2 ms on this machine); then
``--clients`` concurrent sessions for ``--seconds`` give turns per second at saturation. Each response's ``rose_timing`` splits the overhead into the gateway's own part
and routing + the control plane; the same client's ``/health`` round trip is the HTTP floor any call to an
engine's HTTP server pays, and ``relay_floor.py``'s relay (the same HTTP server, hand-off, control plane and
executor link with no logic, no engine) is what the gateway's hops cost before ROSE does anything
(``relay_floor_*``). ``max_tokens = 1``:
the engine's part is as small as it gets. Runs `python -m rose_core` with this script's interpreter.

The baseline an agent without ROSE has is an HTTP call to the engine's own OpenAI server, so the same
invocation also starts vLLM's OpenAI server (``vllm.entrypoints.openai.api_server``) on the policy model with
the executor's engine settings, and sends every sequential call's messages to it beside the gateway call (same
client, same prompt, same ``max_tokens``; the two calls of a turn in alternating order): ``vs_vllm_server`` is
the gateway's latency minus that server's, per pair (p50 / p99 of the differences) and as the difference of the two latency percentiles; a
third call, the same one to the server again, gives the pair measure's own noise (``noise_paired_*``).
``--no-direct`` skips it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import relay_floor
from relay_floor import percentile

VLLM_SERVER_TIMEOUT_S = 300.0
CONTEXT_TOKENS = 1024
"""The job's ``max_context_tokens`` and the direct server's ``--max-model-len``: one context for both paths."""

CONFIG = """
models_dir = "{models}"
run_dir = "{work}/run"

[rl]
env = "gateway"
group_size = 2
prompts_per_step = 1000
max_tokens_per_turn = 1
max_context_tokens = {context}

[executors]
dedicated = 1
serving = 0
rollout_capacity = 64  # the saturation phase loads the gateway and the engine, not the scheduler's per-executor cap

[load]
enabled = false
"""


def start_run(work: Path, models: Path) -> tuple[subprocess.Popen[str], str, str]:
    config = work / "gateway.toml"
    config.write_text(CONFIG.format(work=work, models=models, context=CONTEXT_TOKENS))
    proc = subprocess.Popen([sys.executable, "-m", "rose_core", "run", "--steps", "1", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"gateway (http://\S+) key-file (\S+)", line)
        if found:
            threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
            return proc, found.group(1), Path(found.group(2)).read_text().strip()
    raise SystemExit(f"rose run --env gateway ended before printing its gateway line (rc {proc.wait()})")


def start_vllm_server(models: Path) -> tuple[subprocess.Popen[bytes], str]:
    """vLLM's own OpenAI server on the policy model, the settings of the executor's CPU rollout engine (eager,
    bf16, 1 GiB KV cache, the job's context, ``prefill_chunk_tokens`` chunks); its URL once ``/health`` answers."""
    from rose_core.config.executor_config import RolloutSection

    chunk = RolloutSection(model_dir=str(models / "policy")).prefill_chunk_tokens
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(models / "policy"),
           "--served-model-name", "policy", "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
           "--max-model-len", str(CONTEXT_TOKENS), "--max-num-seqs", "64", "--enforce-eager",
           "--max-num-batched-tokens", str(chunk),
           "--enable-chunked-prefill", "--disable-log-stats", "--uvicorn-log-level", "warning"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + VLLM_SERVER_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM's OpenAI server exited (rc {proc.returncode}): run `{' '.join(cmd)}` to see why")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"vLLM's OpenAI server did not answer /health within {VLLM_SERVER_TIMEOUT_S:.0f} s")


def stop(child: subprocess.Popen[Any] | None) -> None:
    if child is not None and child.poll() is None:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)


class Agent:
    """One client connection; ``session(turns)`` runs a session of chat turns and returns per-call figures."""

    def __init__(self, gateway: str, key: str, tag: str, direct: str = "") -> None:
        self.gateway, self.tag, self.direct = gateway, tag, direct
        self.http = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=120)
        self.sessions = 0

    def session(self, turns: int) -> list[dict[str, float]]:
        self.sessions += 1
        opened = self.http.post(f"{self.gateway}/sessions", json={"group": f"{self.tag}-{self.sessions}"}).json()
        url = f"{opened['base_url']}/chat/completions"
        messages = list(relay_floor.FIRST_MESSAGES)
        out = []
        for turn in range(turns):
            body = {"model": "policy", "messages": messages, "max_tokens": 1}
            direct_first = self.direct and turn % 2 == 1  # alternate the order: neither side warms the other's path
            direct_ms = self.direct_call(body) if direct_first else 0.0
            t0 = time.perf_counter()
            resp = self.http.post(url, json=body)
            latency = time.perf_counter() - t0
            data = resp.json()
            if resp.status_code != 200:
                raise SystemExit(f"gateway call failed: {resp.status_code} {data}")
            timing = data["rose_timing"]
            engine, queue = timing["engine_s"], timing["queue_s"]
            out.append({"latency_ms": 1e3 * latency, "engine_ms": 1e3 * engine, "queue_ms": 1e3 * queue,
                        "overhead_ms": 1e3 * (latency - engine - queue), "gateway_ms": 1e3 * timing["gateway_s"],
                        "route_ms": 1e3 * timing["route_s"]})
            if self.direct:
                out[-1]["direct_ms"] = direct_ms if direct_first else self.direct_call(body)
                out[-1]["direct_again_ms"] = self.direct_call(body)  # the pair measure's own noise
            messages += [{"role": "assistant", "content": data["choices"][0]["message"]["content"]},
                         {"role": "user", "content": f"Turn {turn}: you moved. Where now?"}]
        return out

    def direct_call(self, body: dict[str, Any]) -> float:
        """The same chat call to vLLM's own OpenAI server: its latency in ms."""
        t0 = time.perf_counter()
        resp = self.http.post(f"{self.direct}/v1/chat/completions", json=body)
        latency = time.perf_counter() - t0
        if resp.status_code != 200:
            raise SystemExit(f"vLLM server call failed: {resp.status_code} {resp.text[:300]}")
        return 1e3 * latency


def vs_vllm_server(calls: list[dict[str, float]]) -> dict[str, float]:
    """The gateway's latency against vLLM's own server for the same calls: per pair, and percentile against
    percentile (what a latency dashboard would show moving from the one endpoint to the other). ``noise_*``:
    the same pair measure between two identical calls to the server, the floor under ``paired_*``."""
    pairs = [c["latency_ms"] - c["direct_ms"] for c in calls]
    noise = [c["direct_again_ms"] - c["direct_ms"] for c in calls]  # the same call twice to the same server
    gateway = [c["latency_ms"] for c in calls]
    direct = [c["direct_ms"] for c in calls]
    return {"vllm_server_p50_ms": round(statistics.median(direct), 3),
            "vllm_server_p99_ms": round(percentile(direct, 0.99), 3),
            "paired_p50_ms": round(statistics.median(pairs), 3),
            "paired_p99_ms": round(percentile(pairs, 0.99), 3),
            "p50_minus_p50_ms": round(statistics.median(gateway) - statistics.median(direct), 3),
            "p99_minus_p99_ms": round(percentile(gateway, 0.99) - percentile(direct, 0.99), 3),
            "noise_paired_p50_ms": round(statistics.median(noise), 3),
            "noise_paired_p99_ms": round(percentile(noise, 0.99), 3)}


def http_floor(gateway: str, key: str, calls: int) -> dict[str, float]:
    """The same client's round trip to the gateway's ``/health`` (no body, no turn): what any HTTP call to an
    engine's server costs this client and machine, the floor under the gateway's overhead."""
    http = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        http.get(f"{gateway}/health").raise_for_status()
        times.append(1e3 * (time.perf_counter() - t0))
    return {"http_floor_p50_ms": round(statistics.median(times), 3),
            "http_floor_p99_ms": round(percentile(times, 0.99), 3)}


def summary(calls: list[dict[str, float]]) -> dict[str, float]:
    return {f"{name}_{label}": round(fn([c[f"{name}_ms"] for c in calls]), 3)
            for name in ("overhead", "gateway", "route", "latency", "engine", "queue")
            for label, fn in (("p50_ms", statistics.median), ("p99_ms", lambda v: percentile(v, 0.99)))}


def saturate(gateway: str, key: str, clients: int, seconds: float, turns: int) -> dict[str, Any]:
    done: list[dict[str, float]] = []
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def client(index: int) -> None:
        agent = Agent(gateway, key, f"sat{index}")
        while time.monotonic() < until:
            calls = agent.session(turns)
            with lock:
                done.extend(calls)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"clients": clients, "turns": len(done), "turns_per_second": round(len(done) / wall, 1), **summary(done)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--models", default=".rose/models", help="Where the demo models are (generated once).")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-direct", action="store_true", help="Skip the vLLM OpenAI server baseline.")
    args = parser.parse_args()
    models = Path(args.models).resolve()
    if not (models / "policy").is_dir():
        raise SystemExit(f"no policy model under {models}: run `nox -s demo` once, or pass --models DIR")
    with tempfile.TemporaryDirectory(prefix="rose-gateway-bench-") as tmp:
        proc, gateway, key = start_run(Path(tmp), models)
        server, direct = start_vllm_server(models) if not args.no_direct else (None, "")
        try:
            agent = Agent(gateway, key, "seq", direct)
            for _ in range(4):
                agent.session(args.turns)  # warm-up: the engine's first shapes, the client's connection
            calls: list[dict[str, float]] = []
            while len(calls) < args.calls:
                calls += agent.session(args.turns)
            result = {"sequential": {"calls": len(calls), **summary(calls), **http_floor(gateway, key, len(calls)),
                                     **relay_floor.floor(len(calls))},
                      "target_overhead_p99_ms": 2.0}
            if direct:
                result["vs_vllm_server"] = vs_vllm_server(calls)
            stop(server)  # idle, but its engine's processes stay off the saturation phase's cores
            result["saturation"] = saturate(gateway, key, args.clients, args.seconds, args.turns)
        finally:
            stop(server)
            stop(proc)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    seq, sat = result["sequential"], result["saturation"]
    print(f"sequential ({seq['calls']} calls): overhead p50 {seq['overhead_p50_ms']:.2f} ms, p99 "
          f"{seq['overhead_p99_ms']:.2f} ms (target <= 2 ms); latency p50 {seq['latency_p50_ms']:.2f} ms, engine "
          f"p50 {seq['engine_p50_ms']:.2f} ms")
    print(f"  of which: gateway p50 {seq['gateway_p50_ms']:.2f} ms, routing + control plane p50 "
          f"{seq['route_p50_ms']:.2f} ms; the client's HTTP floor (/health) p50 {seq['http_floor_p50_ms']:.2f} ms, "
          f"p99 {seq['http_floor_p99_ms']:.2f} ms")
    print(f"  the same hops with no logic (relay_floor.py): p50 {seq['relay_floor_p50_ms']:.2f} ms, p99 "
          f"{seq['relay_floor_p99_ms']:.2f} ms")
    if "vs_vllm_server" in result:
        vs = result["vs_vllm_server"]
        print(f"  against vLLM's own OpenAI server (same calls; latency p50 {vs['vllm_server_p50_ms']:.2f} ms, p99 "
              f"{vs['vllm_server_p99_ms']:.2f} ms): added p50 {vs['p50_minus_p50_ms']:.2f} ms, p99 "
              f"{vs['p99_minus_p99_ms']:.2f} ms; per pair p50 {vs['paired_p50_ms']:.2f} ms, p99 {vs['paired_p99_ms']:.2f} ms "
              f"(the server against itself: p50 {vs['noise_paired_p50_ms']:.2f} ms, p99 {vs['noise_paired_p99_ms']:.2f} ms)")
    print(f"saturation ({sat['clients']} clients): {sat['turns_per_second']} turns/s; overhead p50 "
          f"{sat['overhead_p50_ms']:.2f} ms, p99 {sat['overhead_p99_ms']:.2f} ms; latency p99 "
          f"{sat['latency_p99_ms']:.2f} ms")


if __name__ == "__main__":
    main()
