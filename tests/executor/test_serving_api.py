"""vLLM's OpenAI-compatible server on our serving engine, exercised with the official ``openai`` client."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
import pytest_asyncio

from rose_core.support.errors import RoseError
from rose_executor.engine.vllm_engine import VllmEngine
from rose_executor.serving.openai_server import OpenAIServer
from rose_executor.serving.serving_monitor import ServingMonitor

pytestmark = pytest.mark.asyncio(loop_scope="module")
MODEL = "prod-model"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def monitor() -> ServingMonitor:
    return ServingMonitor(slo_ttft_s=2.0, slo_tpot_s=0.4, headroom_fraction=0.8)


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
