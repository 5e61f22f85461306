"""The gateway's HTTP bodies: the OpenAI request fields it honours (decoded with msgspec, unknown fields
ignored as OpenAI's own server does), its own session bodies, and ``GatewayError``, the 4xx every bad request
gets (OpenAI's error shape, so the official client raises ``BadRequestError`` & co. with the message).

Honoured: ``model`` (must be ``policy``), ``messages`` / ``prompt``, ``max_tokens`` /
``max_completion_tokens``, ``temperature``, ``top_p``, ``n`` (1 only), ``stream`` (+ ``stream_options.
include_usage``), ``logprobs`` (+ ``top_logprobs`` 0-20; completions' ``logprobs`` 0-20: the alternatives
per token, under the distribution sampled from, as vLLM returns them), ``stop`` (up to 4 strings; the text is cut there, the token ids keep the
token that completed it), ``tools`` (handed to the chat template; with ``[gateway] tool_parser``
set, replies carry ``tool_calls`` parsed by vLLM's parser: ``reply_parser``), ``tool_choice`` (``none``
leaves a reply unparsed), ``parallel_tool_calls``. Refused with a
400 naming the field: ``n > 1``, ``top_logprobs`` over 20 or without ``logprobs``, ``best_of > 1``,
``echo``. ``seed`` is
ignored: vLLM's CPU engines cannot seed one request with chunked prefill (docs/gateway.md).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

POLICY_MODEL = "policy"
"""The one model name the gateway serves: the job's policy, at whatever version the window allows."""


class GatewayError(Exception):
    """A request the gateway refuses: ``status`` (4xx/5xx), a message that names the fix, the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _Sampling(msgspec.Struct, kw_only=True):
    model: str = POLICY_MODEL
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None


class ChatRequest(_Sampling, kw_only=True):
    messages: list[dict[str, Any]]
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[int]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None


class NewSession(msgspec.Struct):
    group: str
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class Reward(msgspec.Struct):
    reward: float
    success: bool | None = None
    """Did the agent solve the task (the report's success rate); default: ``reward > 0``."""


def decode(body: bytes, kind: type[Any], what: str) -> Any:
    """``body`` as ``kind``; a 400 that names the field and the expected type when it is not one."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise GatewayError(400, f"invalid {what} body: {exc}", _field_of(str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise GatewayError(400, f"malformed JSON body ({exc}): send a JSON object") from exc


def _field_of(message: str) -> str | None:
    """``$.messages[0]`` -> ``messages`` (msgspec's error path), for the error's ``param``."""
    start = message.find("`$.")
    if start < 0:
        return None
    path = message[start + 3:].split("`", 1)[0]
    return path.split("[", 1)[0].split(".", 1)[0] or None


def check_sampling(req: _Sampling, max_tokens_limit: int) -> int:
    """The call's ``max_tokens`` (default: the job's ``rl.max_tokens_per_turn``) after refusing what the
    gateway cannot honour; a 400 naming the field otherwise."""
    if req.model != POLICY_MODEL:
        raise GatewayError(404, f"model {req.model!r} does not exist: the gateway serves one model, "
                                f"{POLICY_MODEL!r} (the job's policy)", "model", "not_found_error")
    if req.n != 1:
        raise GatewayError(400, f"n = {req.n}: the gateway samples one choice per call (each is one turn of "
                                "the session); open one session per sample (the group's sessions)", "n")
    stop_strings(req.stop)
    wanted = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    tokens = max_tokens_limit if wanted is None else wanted
    if not 1 <= tokens <= max_tokens_limit:
        raise GatewayError(400, f"max_tokens = {tokens}: it must be 1..{max_tokens_limit} (the job's "
                                "rl.max_tokens_per_turn)", "max_tokens")
    if req.temperature is not None and not 0.0 <= req.temperature <= 2.0:
        raise GatewayError(400, f"temperature = {req.temperature}: it must be in [0, 2]", "temperature")
    if req.top_p is not None and not 0.0 < req.top_p <= 1.0:
        raise GatewayError(400, f"top_p = {req.top_p}: it must be in (0, 1]", "top_p")
    return tokens


MAX_STOPS = 4
"""OpenAI's limit on ``stop`` strings per call."""


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """A call's ``stop`` as a tuple (a 400 naming the limit when it has more than ``MAX_STOPS`` strings, an
    empty one or one over 256 characters)."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOPS or any(not s or len(s) > 256 for s in stops):
        raise GatewayError(400, f"stop = {stop!r}: send at most {MAX_STOPS} non-empty strings of at most 256 "
                                "characters", "stop")
    return stops


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to the first of ``stops`` it contains (excluded, as OpenAI's API returns it)."""
    cuts = [text.find(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text


MAX_TOP_LOGPROBS = 20
"""vLLM's default ``max_logprobs``: the most alternatives per token a call may ask for."""


def top_logprobs(req: ChatRequest | CompletionRequest) -> int:
    """The alternatives per sampled token the call asks for: chat's ``top_logprobs`` (with ``logprobs``),
    completions' ``logprobs``."""
    if isinstance(req, ChatRequest):
        return int(req.top_logprobs or 0) if req.logprobs else 0
    return int(req.logprobs or 0)


def check_chat(req: ChatRequest) -> None:
    if not req.messages:
        raise GatewayError(400, "messages is empty: send at least one message", "messages")
    for i, message in enumerate(req.messages):
        if not isinstance(message.get("role"), str):
            raise GatewayError(400, f"messages[{i}] has no role: every message needs one (system, user, "
                                    "assistant, tool)", "messages")
        message["content"] = _text_of(message.get("content"), i)
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
        raise GatewayError(400, f"top_logprobs = {req.top_logprobs}: pass 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
    if req.top_logprobs and not req.logprobs:
        raise GatewayError(400, "top_logprobs needs logprobs = true", "top_logprobs")


def check_completion(req: CompletionRequest) -> None:
    if req.echo:
        raise GatewayError(400, "echo is not supported", "echo")
    if req.best_of not in (None, 1):
        raise GatewayError(400, f"best_of = {req.best_of}: the gateway samples one choice per call", "best_of")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
        raise GatewayError(400, f"logprobs = {req.logprobs}: pass 0 to {MAX_TOP_LOGPROBS} (the alternatives per "
                                "token)", "logprobs")
    if not req.prompt:
        raise GatewayError(400, "prompt is empty", "prompt")


def _text_of(content: Any, index: int) -> str:
    """A message's content as text: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise GatewayError(400, f"messages[{index}].content must be a string or a list of text parts (the policy "
                            "reads text only)", "messages")


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
