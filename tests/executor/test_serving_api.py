"""vLLM's OpenAI-compatible server on our serving engine, exercised with the official ``openai`` client."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from rose_core.policy import SloBudgets
from rose_core.support.errors import RoseError
from rose_executor.engine.vllm_engine import VllmEngine
from rose_executor.serving.openai_server import EndpointOptions, OpenAIServer
from rose_executor.serving.serving_monitor import ServingMonitor

pytestmark = pytest.mark.asyncio(loop_scope="module")
MODEL = "prod-model"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def monitor() -> ServingMonitor:
    return ServingMonitor(SloBudgets(2.0, 0.4), headroom_fraction=0.8)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def serving_engine(serving_dir: Path, monitor: ServingMonitor) -> AsyncIterator[VllmEngine]:
    engine = await VllmEngine.create(
        serving_dir, purpose="serving", kv_cache_gib=0.5, max_num_seqs=8, max_model_len=1024, observer=monitor
    )
    yield engine
    engine.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(serving_engine: VllmEngine) -> AsyncIterator[OpenAIServer]:
    started = time.perf_counter()
    server = OpenAIServer("127.0.0.1", 0)
    await server.start(serving_engine, MODEL)
    print(f"\nOpenAI server start: {time.perf_counter() - started:.1f} s")
    yield server
    await server.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def client(server: OpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
        yield client


async def test_models_and_health(server: OpenAIServer, client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    async with httpx.AsyncClient() as http:
        health = await http.get(server.base_url.removesuffix("/v1") + "/health")
    assert health.status_code == 200


async def test_completion_from_token_ids(client: openai.AsyncOpenAI) -> None:
    done = await client.completions.create(model=MODEL, prompt=[5, 17, 42, 8], max_tokens=6, temperature=0.0)
    assert done.usage is not None
    assert done.usage.prompt_tokens == 4
    assert 1 <= done.usage.completion_tokens <= 6
    assert done.choices[0].finish_reason in ("length", "stop")


async def test_completion_from_text_with_logprobs(client: openai.AsyncOpenAI) -> None:
    done = await client.completions.create(
        model=MODEL, prompt="the frozen lake", max_tokens=5, temperature=0.0, logprobs=1
    )
    choice = done.choices[0]
    assert isinstance(choice.text, str)
    assert choice.logprobs is not None
    assert len(choice.logprobs.token_logprobs or []) == done.usage.completion_tokens  # type: ignore[union-attr]


async def test_chat_and_streaming(client: openai.AsyncOpenAI) -> None:
    messages = [{"role": "user", "content": "move left or right?"}]
    chat = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)  # type: ignore[arg-type]
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.prompt_tokens > 3
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=5,
        stream=True,
    )
    chunks = [chunk async for chunk in stream]
    assert len(chunks) >= 2
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason in ("length", "stop")


async def test_unknown_model_is_a_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="nope", prompt=[1, 2], max_tokens=2)


async def test_latency_comes_from_vllm_stats(monitor: ServingMonitor, client: openai.AsyncOpenAI) -> None:
    before = monitor.requests_total
    await client.completions.create(model=MODEL, prompt=[3, 4, 5], max_tokens=4, temperature=0.0)
    snap = monitor.snapshot()
    assert monitor.requests_total == before + 1
    assert snap.ttft_samples >= 1 and snap.ttft_p99_s > 0
    assert snap.tpot_samples >= 1 and snap.tpot_p99_s > 0


async def test_busy_port_is_one_clear_line(server: OpenAIServer) -> None:
    with pytest.raises(RoseError, match=r"serving port 127\.0\.0\.1:\d+ is already in use: set `port` under \[serving\]"):
        OpenAIServer("127.0.0.1", server.port).reserve()


async def test_mounting_vllms_app_leaves_the_executors_log_level_alone(serving_engine: VllmEngine) -> None:
    """vLLM's app imports a package that sets the root logger to ERROR on import (it silenced every INFO
    line of the serving executor); building the app keeps the caller's level."""
    for name in [m for m in sys.modules if m.startswith("model_hosting_container_standards")]:
        del sys.modules[name]  # its import-time side effect runs again
    before = logging.root.level
    logging.root.setLevel(15)
    try:
        await serving_engine.openai_app(MODEL)
        assert logging.root.level == 15
    finally:
        logging.root.setLevel(before)


def self_signed(root: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = root / "cert.pem", root / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_the_endpoint_asks_for_its_key_speaks_tls_and_caps_concurrency(
    serving_engine: VllmEngine, tmp_path: Path
) -> None:
    """``[serving]`` api_key_file, ssl_certfile / ssl_keyfile and max_concurrency (EndpointOptions) reach vLLM's
    app and uvicorn: a wrong key gets 401, plain HTTP gets no answer, and a request past the limit gets 503."""
    cert, key = self_signed(tmp_path)
    options = EndpointOptions(api_key="sk-prod", ssl_certfile=str(cert), ssl_keyfile=str(key), max_concurrency=2)
    guarded = OpenAIServer("127.0.0.1", 0, options)
    await guarded.start(serving_engine, MODEL)
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        assert guarded.base_url.startswith("https://127.0.0.1:")
        async with httpx.AsyncClient(verify=trust) as http:
            right = openai.AsyncOpenAI(base_url=guarded.base_url, api_key="sk-prod", http_client=http, max_retries=0)
            assert [m.id for m in (await right.models.list()).data] == [MODEL]
            wrong = openai.AsyncOpenAI(base_url=guarded.base_url, api_key="sk-other", http_client=http, max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                await wrong.models.list()
        with pytest.raises(httpx.TransportError):
            httpx.get(guarded.base_url.replace("https://", "http://") + "/models", timeout=5)
        _, held = await asyncio.open_connection("127.0.0.1", guarded.port, ssl=trust)  # TLS done: one open
        try:
            async with httpx.AsyncClient(verify=trust) as http:  # ours is the limit's second connection
                refused = await until_status(http, guarded.base_url + "/models", 503)
        finally:
            held.close()
        assert refused.status_code == 503
        async with httpx.AsyncClient(verify=trust) as http:  # the held connection closed: served again
            assert (await until_status(http, guarded.base_url + "/models", 200)).status_code == 200
    finally:
        await guarded.stop()


async def until_status(http: httpx.AsyncClient, url: str, status: int, deadline_s: float = 10.0) -> httpx.Response:
    """GET ``url`` until it answers ``status`` (the server learns of a new connection a moment after it opens)."""
    end = time.monotonic() + deadline_s
    while True:
        response = await http.get(url, headers={"Authorization": "Bearer sk-prod"})
        if response.status_code == status or time.monotonic() > end:
            return response
        await asyncio.sleep(0.1)
