"""Hostile clients against the gateway and the trainer API, over real sockets, while a well-behaved agent plays:
2,000 connections that send part of a request and stall, 8 MiB bodies without a key, ``Content-Length: ²``,
``wait_s=nan``, 10^5 session opens and metadata over the cap, the agents' key on the trainer API. Every one is
refused or bounded; the process's threads stay under the connection cap and its memory under a stated bound;
the agent's calls keep working throughout. (The controller plays no part here: the responder thread of
``test_gateway_http`` answers the turns.)"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from test_gateway_http import KEY, Responder

from rose_core.app.gateway.chat_template import ChatTemplate
from rose_core.app.gateway.gateway import Gateway, GatewayLimits
from rose_core.app.gateway.http_server import ApiServer, GatewayServer, ServerLimits
from rose_core.app.gateway.session_table import SessionLimits, SessionTable
from rose_core.app.jobs.external_trainer import TRAINER_ROUTES, ExternalTrainer
from rose_core.app.rl.demo.models import ModelPaths, load_tokenizer

MAX_CONNECTIONS = 64
MAX_SESSIONS = 1_000
TRAINER_KEY = "t" * 32
HOSTILE = Path(__file__).with_name("hostile_client.py")
RSS_BOUND_BYTES = 300 << 20
"""What the whole attack may add to the process's resident memory (the 8 MiB bodies alone would be 160 MiB
if they were read)."""


@dataclass
class Servers:
    gateway: GatewayServer
    trainer: ApiServer
    table: SessionTable


@pytest.fixture(scope="module")
def servers(models: ModelPaths) -> Iterator[Servers]:
    codec = load_tokenizer(models.policy)
    table = SessionTable(group_size=2, limits=SessionLimits(max_sessions=MAX_SESSIONS, max_metadata_bytes=4096))
    wake = threading.Event()
    from rose_core.app.gateway.turn_bridge import TurnBridge

    bridge = TurnBridge(wake.set)
    responder = Responder(bridge, codec, wake)
    limits = ServerLimits(max_connections=MAX_CONNECTIONS, idle_timeout_s=10.0)
    gateway = Gateway(table, bridge, codec, ChatTemplate(models.policy),
                      GatewayLimits(max_prompt_tokens=400, max_tokens=16, temperature=1.0, turn_timeout_s=30))
    server = GatewayServer(gateway, KEY, limits=limits).start()
    trainer = ApiServer(ExternalTrainer(1), TRAINER_ROUTES, TRAINER_KEY, name="rose-trainer-api", limits=limits,
                        refused_keys={KEY: "this is the agents' gateway key: use the trainer's key"}).start()
    responder.thread.start()
    yield Servers(server, trainer, table)
    responder.stop = True
    trainer.close()
    server.close()


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def agent_turn(url: str, group: str) -> str:
    """One well-behaved agent session: open, one chat call (a new connection each time), reward."""
    session = httpx.post(f"{url}/sessions", json={"group": group}, headers={"Authorization": f"Bearer {KEY}"},
                         timeout=10).json()
    client = openai.OpenAI(base_url=session["base_url"], api_key=KEY, max_retries=0, timeout=10)
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "go"}])
    httpx.post(f"{url}/sessions/{session['session_id']}/reward", json={"reward": 1.0},
               headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    return str(reply.choices[0].message.content)


def raw(url: str, request: bytes, timeout: float = 10.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # the server closed on us: its answer is still there to read
            sock.sendall(request)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def hostile(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HOSTILE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def test_stalled_connections_are_shed_and_an_agent_keeps_playing(servers: Servers) -> None:
    """2,000 connections from another process, each a request head that never ends: the server holds at most
    half its cap of them (the oldest shed for each newcomer), its threads stay under the cap, and an agent that
    connects meanwhile plays its turn."""
    url = servers.gateway.url
    threads_before, rss_before = threading.active_count(), rss_bytes()
    attacker = hostile("stall", url, "2000")
    try:
        assert attacker.stdout is not None and attacker.stdout.readline().strip() == "stalled"
        for round_ in range(3):
            assert agent_turn(url, f"stall-{round_}")  # a newcomer sheds the oldest stalled connection
            assert servers.gateway.connections() <= MAX_CONNECTIONS
            assert threading.active_count() <= threads_before + MAX_CONNECTIONS + 2
        assert servers.gateway.shed >= 2_000 - MAX_CONNECTIONS
        assert rss_bytes() - rss_before < RSS_BOUND_BYTES
    finally:
        attacker.communicate(timeout=60)


def test_bodies_without_the_key_are_never_read(servers: Servers) -> None:
    url = servers.gateway.url
    rss_before = rss_bytes()
    body = b"x" * (8 << 20)
    for _ in range(20):
        head = f"POST /sessions HTTP/1.1\r\nHost: g\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        answer = raw(url, head + body)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert rss_bytes() - rss_before < RSS_BOUND_BYTES
    assert agent_turn(url, "after-bodies")


def test_odd_lengths_and_waits_get_4xx(servers: Servers) -> None:
    superscript = "POST /sessions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {}\r\nContent-Length: ²\r\n\r\n"
    assert raw(servers.gateway.url, superscript.format(KEY).encode()).startswith(b"HTTP/1.1 413")
    trainer = servers.trainer.url
    nan = httpx.get(f"{trainer}/trainer/next?wait_s=nan", headers={"Authorization": f"Bearer {TRAINER_KEY}"})
    assert nan.status_code == 400 and "finite" in nan.json()["error"]["message"]
    agents_key = httpx.get(f"{trainer}/trainer/status", headers={"Authorization": f"Bearer {KEY}"})
    assert agents_key.status_code == 403 and "gateway key" in agents_key.json()["error"]["message"]
    assert httpx.get(f"{trainer}/trainer/status", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_a_flood_of_sessions_is_capped_and_large_metadata_refused(servers: Servers) -> None:
    """10^5 session opens pipelined on one connection: the table stops at its cap (429 after), and metadata over
    its cap is refused (413) before anything is kept."""
    url = servers.gateway.url
    rss_before = rss_bytes()
    big = json.dumps({"group": "big", "metadata": {"blob": "y" * 10_000}}).encode()
    answer = raw(url, b"POST /sessions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer " + KEY.encode()
                 + f"\r\nContent-Length: {len(big)}\r\nConnection: close\r\n\r\n".encode() + big)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    flood = hostile("flood", url, "100000", KEY)
    out, _ = flood.communicate(timeout=600)
    statuses = json.loads(out)
    assert sum(statuses.values()) == 100_001 and statuses["429"] >= 100_000 - MAX_SESSIONS, statuses
    assert len(servers.table._sessions) <= MAX_SESSIONS
    assert rss_bytes() - rss_before < RSS_BOUND_BYTES
