"""The gateway over real HTTP with the official `openai` client, the policy's real tokenizer and chat template;
a thread that answers turns from the bridge plays the controller and its executors (the unit-test double of
`rose run --env gateway`, which tests/integration/test_rose_run_gateway.py runs for real).

The history test: a 10-turn session sends its full message list every turn; the gateway tokenises only the
new messages, and what the trainer gets is the session's one token sequence with the response mask."""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rose_core.app.gateway.chat_template import ChatTemplate
from rose_core.app.gateway.gateway import Gateway, GatewayLimits
from rose_core.app.gateway.http_server import REFUSED_REQUESTS, GatewayServer
from rose_core.app.gateway.session_table import SessionTable
from rose_core.app.gateway.turn_bridge import TurnBridge, TurnOutcome
from rose_core.app.rl.algorithm.grpo import build_samples
from rose_core.app.rl.demo.models import ModelPaths, TokenizerCodec, load_tokenizer
from rose_core.protocol.messages import TurnResult

KEY = "k" * 32
FUZZ_GROUPS = itertools.count()
REPLIES = ["move right", "move down", "move left", "move up"]


class Responder:
    """Plays the controller: answers every turn the bridge hands over with the next reply's tokens + eos."""

    def __init__(self, bridge: TurnBridge, codec: TokenizerCodec, wake: threading.Event) -> None:
        self.bridge, self.codec = bridge, codec
        self.wake = wake
        self.stop = False
        self.answered = 0
        self.prompts: list[list[int]] = []
        self.give_up: set[str] = set()
        """Sessions whose next turn the controller gives up (it failed on every executor)."""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop:
            self.wake.wait(0.05)
            self.wake.clear()
            for turn in self.bridge.take():
                if turn.session_id in self.give_up:
                    self.give_up.discard(turn.session_id)
                    self.bridge.fail(turn.turn_id, "engine_error: EngineDeadError")
                    continue
                self.prompts.append(list(turn.prompt_token_ids))
                text = REPLIES[self.answered % len(REPLIES)]
                ids = [*self.codec.encode(text), self.codec.eos_id][: turn.sampling.max_tokens]
                self.answered += 1
                k = turn.sampling.top_logprobs  # the token itself, then the next ids; the last past the nucleus
                tops = {"top_token_ids": np.array([[t + j for j in range(k)] for t in ids], dtype=np.int32),
                        "top_logprobs": np.array([[-0.25 - j if j < k - 1 else -np.inf for j in range(k)]
                                                  for _ in ids], dtype=np.float32)} if k else {}
                result = TurnResult(turn_id=turn.turn_id, trajectory_id=turn.session_id, attempt=0,
                                    executor_id="dedicated-0", weight_version=0,
                                    output_token_ids=np.array(ids, dtype=np.int32),
                                    output_logprobs=np.full(len(ids), -0.25), finish_reason="stop", **tops)
                self.bridge.resolve(TurnOutcome(result, "dedicated"))


@dataclass
class Live:
    url: str
    table: SessionTable
    codec: TokenizerCodec
    responder: Responder

    def session(self, group: str = "g") -> dict[str, Any]:
        resp = httpx.post(f"{self.url}/sessions", json={"group": group}, headers=auth())
        assert resp.status_code == 200, resp.text
        return resp.json()

    def client(self, session: dict[str, Any], key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=session["base_url"], api_key=key, max_retries=0, timeout=30)


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def live(models: ModelPaths) -> Iterator[Live]:
    codec = load_tokenizer(models.policy)
    table = SessionTable(group_size=2)
    wake = threading.Event()
    bridge = TurnBridge(wake.set)
    responder = Responder(bridge, codec, wake)
    limits = GatewayLimits(max_prompt_tokens=400, max_tokens=16, temperature=1.0, turn_timeout_s=30)
    gateway = Gateway(table, bridge, codec, ChatTemplate(models.policy), limits)
    server = GatewayServer(gateway, KEY).start()
    responder.thread.start()
    yield Live(server.url, table, codec, responder)
    responder.stop = True
    server.close()


def test_a_ten_turn_session_is_tokenised_once_and_trained_as_one_masked_sequence(live: Live,
                                                                                  models: ModelPaths) -> None:
    session = live.session("history")
    client = live.client(session)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You walk a frozen lake."},
                                      {"role": "user", "content": "You are at the start. Where to?"}]
    replies = []
    for turn in range(10):
        reply = client.chat.completions.create(model="policy", messages=messages)  # the whole list, every turn
        replies.append(reply)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": f"Turn {turn}: you moved. Where now?"}]
    state = httpx.get(f"{live.url}/sessions/{session['session_id']}", headers=auth()).json()
    (segment,) = state["segments"]
    tokens, mask = segment["tokens"], segment["mask"]
    generated = [t for r in replies for t in r.choices[0].model_extra["token_ids"]]
    assert state["encoded_tokens"] == len(tokens) - len(generated)  # the history was never tokenised again
    last_prompt = live.responder.prompts[-1]
    naive = sum(len(p) for p in live.responder.prompts[-10:])
    assert state["encoded_tokens"] < naive / 4, (state["encoded_tokens"], naive)
    assert [t for t, m in zip(tokens, mask, strict=True) if m] == generated
    # what a whole re-tokenisation of the conversation gives (this template ends each message with eos + "\n")
    rendered = ChatTemplate(models.policy).render(messages[:-1])
    full = live.codec.encode(rendered)
    assert tokens == full[: len(tokens)] and last_prompt == tokens[: len(last_prompt)]
    httpx.post(f"{live.url}/sessions/{session['session_id']}/reward", json={"reward": 1.0}, headers=auth())
    other = live.session("history")
    live.client(other).completions.create(model="policy", prompt="one more")
    httpx.post(f"{live.url}/sessions/{other['session_id']}/reward", json={"reward": 0.0}, headers=auth())
    (group,) = live.table.take_groups(1)
    trajectory = next(t for t in group if t.trajectory_id == session["session_id"])
    samples = [s for s in build_samples(group) if s.trajectory_id == trajectory.trajectory_id]
    assert len(samples) == 10
    for sample in samples:  # every trained turn is a prefix of the one sequence; its response is masked 1
        end = len(sample.prompt_token_ids) + len(sample.response_token_ids)
        assert [*sample.prompt_token_ids, *sample.response_token_ids] == tokens[:end]
        assert mask[len(sample.prompt_token_ids):end] == [1] * len(sample.response_token_ids)


def test_chat_returns_token_ids_logprobs_and_the_weight_version(live: Live) -> None:
    client = live.client(live.session("chat"))
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                           logprobs=True, max_tokens=16)
    choice = reply.choices[0]
    ids = choice.model_extra["token_ids"]
    assert ids[-1] == live.codec.eos_id and choice.message.content in REPLIES
    assert [t.logprob for t in choice.logprobs.content] == [-0.25] * len(ids)
    assert reply.model_extra["rose_weight_version"] == 0 and reply.usage.completion_tokens == len(ids)
    assert client.models.list().data[0].id == "policy"


def test_a_call_whose_turn_was_given_up_gets_a_502_and_the_session_goes_on(live: Live) -> None:
    session = live.session("given-up")
    client = live.client(session)
    live.responder.give_up.add(session["session_id"])
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "go"}])
    assert failed.value.status_code == 502 and "scheduler.turn_retries" in failed.value.message
    again = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "go"}])
    assert again.choices[0].message.content in REPLIES


def test_streaming_chat_and_completions_carry_the_same_reply(live: Live) -> None:
    client = live.client(live.session("stream"))
    chunks = list(client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "go"}],
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text in REPLIES and chunks[-1].usage is not None
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    streamed = list(client.completions.create(model="policy", prompt="walk", stream=True, logprobs=0))
    assert streamed[0].choices[0].text in REPLIES and streamed[0].choices[0].logprobs.token_logprobs


def test_token_prompts_extend_the_session_without_tokenising(live: Live) -> None:
    session = live.session("tokens")
    client = live.client(session)
    first = client.completions.create(model="policy", prompt=[5, 6, 7])
    ids = first.choices[0].model_extra["token_ids"]
    client.completions.create(model="policy", prompt=[5, 6, 7, *ids, 8])
    state = httpx.get(f"{live.url}/sessions/{session['session_id']}", headers=auth()).json()
    assert state["encoded_tokens"] == 0 and len(state["segments"]) == 1
    assert state["segments"][0]["tokens"][: 4 + len(ids)] == [5, 6, 7, *ids, 8]


def test_bad_requests_get_clear_4xx_and_the_session_in_flight_goes_on(live: Live) -> None:
    session = live.session("bad")
    client = live.client(session)
    user = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model="policy", messages=user)
    chat_url = f"{session['base_url']}/chat/completions"
    cases: list[tuple[str, dict[str, Any], dict[str, str], int, str]] = [
        ("n > 1", {"model": "policy", "messages": user, "n": 2}, auth(), 400, "one choice per call"),
        ("wrong model", {"model": "gpt-4o", "messages": user}, auth(), 404, "does not exist"),
        ("over the context", {"model": "policy", "messages": [{"role": "user", "content": "x " * 900}]}, auth(),
         400, "over the policy's context"),
        ("no key", {"model": "policy", "messages": user}, {}, 401, "missing bearer key"),
        ("wrong key", {"model": "policy", "messages": user}, auth("w" * 32), 401, "wrong bearer key"),
        ("no messages", {"model": "policy"}, auth(), 400, "messages"),
        ("max_tokens", {"model": "policy", "messages": user, "max_tokens": 10_000}, auth(), 400, "max_tokens"),
    ]
    for what, body, headers, status, words in cases:
        resp = httpx.post(chat_url, json=body, headers=headers)
        assert resp.status_code == status and words in resp.json()["error"]["message"], (what, resp.text)
    for path, status in ((f"{live.url}/sessions/ffff/v1/chat/completions", 404), (f"{live.url}/nowhere", 404)):
        resp = httpx.post(path, json={"model": "policy", "messages": user}, headers=auth())
        assert resp.status_code == status, resp.text
    resp = httpx.post(chat_url, content=b"{not json", headers={**auth(), "Content-Type": "application/json"})
    assert resp.status_code == 400 and "malformed JSON" in resp.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="one choice per call"):
        client.chat.completions.create(model="policy", messages=user, n=2)
    with pytest.raises(openai.AuthenticationError):
        live.client(session, key="nope" * 8).chat.completions.create(model="policy", messages=user)
    reply = client.chat.completions.create(model="policy", messages=user)  # the session goes on
    assert reply.choices[0].model_extra["token_ids"]
    closed = live.session("bad")
    live.client(closed).completions.create(model="policy", prompt="x")
    httpx.post(f"{live.url}/sessions/{closed['session_id']}/reward", json={"reward": 0.0}, headers=auth())
    with pytest.raises(openai.ConflictError, match="is closed"):
        live.client(closed).completions.create(model="policy", prompt="x")
    state = httpx.get(f"{live.url}/sessions/{session['session_id']}", headers=auth()).json()
    assert state["turns"] == 2  # the refused calls took nothing from the session


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                     max_size=4), max_leaves=12)
BODIES = st.one_of(
    st.binary(max_size=64),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"messages": JSON_VALUES}, optional={"model": JSON_VALUES, "n": JSON_VALUES,
                                                                "max_tokens": JSON_VALUES, "stream": JSON_VALUES,
                                                                "temperature": JSON_VALUES}).map(
        lambda v: json.dumps(v).encode()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES, route=st.sampled_from(["v1/chat/completions", "v1/completions", "reward", ""]))
def test_malformed_bodies_get_4xx_never_5xx_and_lose_nothing(live: Live, body: bytes, route: str) -> None:
    session = live.session(f"fuzz-{next(FUZZ_GROUPS)}")
    url = f"{live.url}/sessions/{session['session_id']}/{route}" if route else f"{live.url}/sessions"
    resp = httpx.post(url, content=body, headers={**auth(), "Content-Type": "application/json"})
    assert resp.status_code < 500, resp.text
    if resp.status_code >= 400:
        assert resp.json()["error"]["message"]
    state = httpx.get(f"{live.url}/sessions/{session['session_id']}", headers=auth()).json()
    assert state["turns"] in (0, 1)


REQUEST_LINES = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda method, path, version, headers: f"{method} {path} {version}\r\n{headers}\r\n\r\n".encode(),
              st.sampled_from(["GET", "POST", "PUT", "DELETE", "BREW", "", "G\x00T"]),
              st.text(max_size=40), st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/9.9", "", "SPDY"]),
              st.text(max_size=120)),
    st.just(b"POST /sessions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"),
    st.just(b"GET /health HTTP/1.1\r\n" + b"X: " + b"a" * 70_000 + b"\r\n\r\n"),  # a header over the stdlib's limit
)


REFUSALS = (400, 401, 404, 405, 411, 413, 414, 431, 501)


def refused(status: str) -> float:
    return float(REFUSED_REQUESTS.labels("rose-gateway", status)._value.get())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=REQUEST_LINES)
def test_raw_bytes_on_the_gateway_port_never_stop_it_and_refusals_are_counted(live: Live, raw: bytes) -> None:
    """Below HTTP: whatever bytes arrive on the port (garbage, broken request lines, a body it will not read,
    a header too long), the connection gets a 4xx or is closed, the refusal is counted, and the next client is
    served as if nothing happened."""
    host, port = live.url.removeprefix("http://").split(":")
    before = sum(refused(str(code)) for code in REFUSALS)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/") else b""
    assert status == b"501" or not status.startswith(b"5"), answer[:300]  # 501: a method it does not have
    if status.startswith(b"4") or status == b"501":
        assert sum(refused(str(code)) for code in REFUSALS) > before
    assert httpx.get(f"{live.url}/health").json() == {"status": "ok"}
    live.session(f"after-raw-{next(FUZZ_GROUPS)}")


def test_a_call_that_times_out_gets_504_withdraws_its_turn_and_frees_its_session(models: ModelPaths) -> None:
    """``gateway.turn_timeout_s`` passes with no result: the agent gets a 504 that says to retry; the turn is
    withdrawn (the controller thread cancels it on its executor: ``take_abandoned``), never taken if it was still
    waiting; the session is free for the retry."""
    codec = load_tokenizer(models.policy)
    bridge = TurnBridge()
    limits = GatewayLimits(max_prompt_tokens=400, max_tokens=4, temperature=1.0, turn_timeout_s=0.3)
    server = GatewayServer(Gateway(SessionTable(group_size=2), bridge, codec, None, limits), KEY).start()
    try:
        session = httpx.post(f"{server.url}/sessions", json={"group": "g"}, headers=auth()).json()
        url = f"{session['base_url']}/completions"

        def call() -> httpx.Response:
            return httpx.post(url, json={"model": "policy", "prompt": [5, 6, 7]}, headers=auth(), timeout=30)

        first = call()  # nobody took it: never taken after
        assert first.status_code == 504 and "gateway.turn_timeout_s" in first.json()["error"]["message"]
        assert bridge.take() == [] and bridge.take_abandoned() == []
        taker = threading.Timer(0.05, bridge.take)  # the controller takes the retry, and never answers
        taker.start()
        second = call()
        assert second.status_code == 504 and len(bridge.take_abandoned()) == 1  # withdrawn from the controller
    finally:
        server.close()


def test_top_logprobs_come_back_as_openais_api_shapes_them(live: Live) -> None:
    """Chat's ``top_logprobs`` (with ``logprobs``) and completions' ``logprobs = k``: k alternatives per token,
    likeliest first, each with its text; -inf (outside the nucleus) as -9999.0, as vLLM's server sends it.
    Over 20, or without ``logprobs``, is a 400 naming the field."""
    client = live.client(live.session("tops"))
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Where?"}],
                                           logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    ids = reply.choices[0].model_extra["token_ids"]
    assert len(content) == len(ids) and all(len(c.top_logprobs) == 3 for c in content)
    for token_id, entry in zip(ids, content, strict=True):
        assert entry.top_logprobs[0].token == live.codec.decode([token_id])
        assert [t.logprob for t in entry.top_logprobs] == [-0.25, -1.25, -9999.0]
    for bad, field in (({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"top_logprobs": 2}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError, match=field):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], **bad)
    completion = live.client(live.session("tops")).completions.create(model="policy", prompt="Where?", logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert logprobs.top_logprobs is not None and len(logprobs.top_logprobs) == len(logprobs.tokens)
    for token, top in zip(logprobs.tokens, logprobs.top_logprobs, strict=True):  # {text: logprob}: OpenAI's form
        assert top[token] == -0.25 and set(top.values()) <= {-0.25, -9999.0}  # (two tokens of one text: one key)
