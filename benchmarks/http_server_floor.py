"""The HTTP server under the gateway and the trainer API against uvicorn, the server vLLM's OpenAI server runs on,
serving the same call: the choice of decision 331 measured.

    python3 benchmarks/http_server_floor.py [--calls 2000] [--rounds 3] [--clients 16] [--seconds 5] [--json]

Three servers, each in a process of its own, serve one route: a POST of a chat body (``relay_floor``'s first
messages, padded to a 10-turn history: about 3 KB), its bearer key checked, the JSON parsed, a 1 KB JSON reply.

- ``stdlib``: ROSE's server (``rose_core.app.gateway.http_server.ApiServer``: ``ThreadingHTTPServer`` with the
  connection cap, idle timeout and key-before-body of decision 331), the route as a gateway route is written;
- ``uvicorn``: uvicorn with httptools and uvloop and a bare ASGI app (the least a uvicorn server does);
- ``fastapi``: the same uvicorn under FastAPI (what ``vllm serve`` runs).

Per round and server, in alternating order: ``--calls`` sequential calls from one keep-alive ``httpx`` client
(p50 / p99 latency: what one agent's call pays), then ``--clients`` threads for ``--seconds`` (calls per second
at saturation, and their p99). The client shares the 2 cores with the server; figures are medians over rounds.
"""

import argparse  # no `from __future__ import annotations`: FastAPI reads the handler's annotations as objects
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from relay_floor import FIRST_MESSAGES, percentile

KEY = "http-server-floor"
SERVERS = ("stdlib", "uvicorn", "fastapi")
WARMUP = 200
BODY = json.dumps({"model": "policy", "logprobs": True, "messages": FIRST_MESSAGES + [
    {"role": "assistant" if i % 2 == 0 else "user", "content": f"Turn {i}: you moved right; the lake is calm. " * 6}
    for i in range(10)]}).encode()


def reply_for(request: dict[str, Any]) -> dict[str, Any]:
    """A chat completion's shape, about 1 KB."""
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": request["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "token_ids": list(range(40)),
                         "message": {"role": "assistant", "content": "right " * 100}}],
            "usage": {"prompt_tokens": len(request["messages"]) * 40, "completion_tokens": 40}}


# ---------------------------------------------------------------- the servers (child processes)

def serve_stdlib(port: int) -> None:
    from rose_core.app.gateway.http_server import ApiServer

    routes = [("POST", re.compile(r"/v1/chat/completions"), lambda _t, _p, body: reply_for(json.loads(body)))]
    ApiServer(None, routes, KEY, port=port).start()
    threading.Event().wait()


def _asgi_app() -> Any:
    expected = f"Bearer {KEY}".encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        authorized = dict(scope["headers"]).get(b"authorization") == expected
        status, data = (200, json.dumps(reply_for(json.loads(body))).encode()) if authorized else (401, b"{}")
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    return app


def _fastapi_app() -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    api = FastAPI()

    @api.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return JSONResponse({}, status_code=401)
        return JSONResponse(reply_for(await request.json()))

    return api


def serve_uvicorn(port: int, app: Any) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, http="httptools", loop="uvloop", lifespan="off",
                log_level="warning", access_log=False)


def serve(kind: str, port: int) -> None:
    if kind == "stdlib":
        serve_stdlib(port)
    else:
        serve_uvicorn(port, _asgi_app() if kind == "uvicorn" else _fastapi_app())


# ---------------------------------------------------------------- the client (this process)

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(kind: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(port)],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                                              os.environ.get("PYTHONPATH", "")])})
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"the {kind} server did not start in 60 s")


def sequential(url: str, calls: int) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with httpx.Client(timeout=30) as client:
        times = []
        for i in range(WARMUP + calls):
            t0 = time.perf_counter()
            response = client.post(url, content=BODY, headers=headers)
            elapsed = time.perf_counter() - t0
            if response.status_code != 200:
                raise SystemExit(f"{url}: {response.status_code}")
            if i >= WARMUP:
                times.append(elapsed)
    return {"p50_ms": 1e3 * statistics.median(times), "p99_ms": 1e3 * percentile(times, 0.99)}


def saturation(url: str, clients: int, seconds: float) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    stop = time.monotonic() + seconds
    times: list[float] = []
    lock = threading.Lock()

    def run() -> None:
        mine = []
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                client.post(url, content=BODY, headers=headers).raise_for_status()
                mine.append(time.perf_counter() - t0)
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"calls_per_s": len(times) / seconds, "saturated_p99_ms": 1e3 * percentile(times, 0.99)}


def measure(kind: str, calls: int, clients: int, seconds: float) -> dict[str, float]:
    proc, url = start(kind)
    try:
        return {**sequential(url, calls), **saturation(url, clients, seconds)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    rounds: list[dict[str, dict[str, float]]] = []
    for r in range(args.rounds):
        order = SERVERS if r % 2 == 0 else tuple(reversed(SERVERS))
        rounds.append({kind: measure(kind, args.calls, args.clients, args.seconds) for kind in order})
        print(f"# round {r + 1}: " + ", ".join(f"{k} p50 {v['p50_ms']:.3f} ms" for k, v in rounds[-1].items()),
              file=sys.stderr, flush=True)
    medians = {kind: {field: round(statistics.median(r[kind][field] for r in rounds), 3)
                      for field in rounds[0][kind]} for kind in SERVERS}
    result = {"calls": args.calls, "rounds": args.rounds, "clients": args.clients, "medians": medians}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for kind, m in medians.items():
        print(f"{kind:8s} sequential p50 {m['p50_ms']:.3f} ms, p99 {m['p99_ms']:.3f} ms; {args.clients} clients: "
              f"{m['calls_per_s']:.0f} calls/s, p99 {m['saturated_p99_ms']:.2f} ms")


if __name__ == "__main__":
    main()
