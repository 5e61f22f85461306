"""The rollout gateway's requests, independent of HTTP: sessions, chat and text completions, rewards.

Each call is one turn of its session's trajectory: its prompt comes from the session's token history
(``session_history``: only new material is tokenised), it is handed to the controller thread
(``turn_bridge``) and routed by the elastic scheduler like any turn (affinity by session, borrowed serving
executors when they have headroom), and its reply is recorded token for token (ids, behaviour logprobs,
weight version) before the client sees it. ``http_server`` puts this on a socket.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rose_core.app.gateway.chat_template import ChatTemplate
from rose_core.app.gateway.openai_api import (
    POLICY_MODEL,
    ChatRequest,
    CompletionRequest,
    GatewayError,
    NewSession,
    Reward,
    check_chat,
    check_completion,
    check_sampling,
    cut_at_stop,
    decode,
    stop_strings,
    top_logprobs,
)
from rose_core.app.gateway.reply_parser import ParsedReply, ReplyParser
from rose_core.app.gateway.session_history import SessionHistory
from rose_core.app.gateway.session_table import SessionTable
from rose_core.app.gateway.turn_bridge import BridgeClosed, GatewayTurn, TurnBridge, TurnFailed, TurnOutcome
from rose_core.app.rl.algorithm.trajectory import Turn
from rose_core.app.rl.environments.codec import TextCodec
from rose_core.protocol.messages import SamplingParams


@dataclass(slots=True, frozen=True)
class GatewayLimits:
    max_prompt_tokens: int
    """A call's prompt (the session's segment) may not be longer (``rl.max_context_tokens``)."""
    max_tokens: int
    """The most tokens one call may sample, and its default (``rl.max_tokens_per_turn``)."""
    temperature: float
    """The default temperature (``rl.sampling.temperature``)."""
    turn_timeout_s: float
    """A call whose turn has not finished by then gets a 504 (its prompt tokens are taken back)."""


@dataclass(slots=True)
class Reply:
    """What one call produced, for the response builders."""

    session_id: str
    prompt_tokens: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    outcome: TurnOutcome
    started: float
    """``perf_counter`` when the call arrived; ``turn_s``: from its hand-off to the controller to its result."""
    turn_s: float
    prompt: list[int] = field(default_factory=list)
    parsed: ParsedReply | None = None
    """The reply as vLLM's parsers read it (``[gateway] tool_parser`` / ``reasoning_parser``); None: text."""
    deltas: list[dict[str, Any]] = field(default_factory=list)
    """A parsed reply streamed: the deltas ``vllm serve`` would send for its tokens."""


class Gateway:
    def __init__(self, table: SessionTable, bridge: TurnBridge, codec: TextCodec, template: ChatTemplate | None,
                 limits: GatewayLimits, base_url: str = "", parser: ReplyParser | None = None) -> None:
        self.table = table
        self.parser = parser
        self.bridge = bridge
        self.codec = codec
        self.template = template
        self.limits = limits
        self.base_url = base_url
        self._calls = itertools.count()

    # ---------------------------------------------------------------- sessions

    def open_session(self, body: bytes) -> dict[str, Any]:
        req: NewSession = decode(body, NewSession, "session")
        session = self.table.open(req.group, req.metadata)
        return {"session_id": session.session_id, "group": req.group,
                "base_url": f"{self.base_url}/sessions/{session.session_id}/v1"}

    def reward(self, session_id: str, body: bytes) -> dict[str, Any]:
        req: Reward = decode(body, Reward, "reward")
        if req.reward != req.reward or req.reward in (float("inf"), float("-inf")):
            raise GatewayError(400, f"reward {req.reward} must be a finite number", "reward")
        session = self.table.close(session_id, req.reward, req.success)
        return {"session_id": session_id, "closed": True, "turns": session.calls}

    def describe(self, session_id: str) -> dict[str, Any]:
        """A session's token history: its segments (tokens and response mask), what was tokenised, its turns."""
        session = self.table.get(session_id)
        history = session.history
        return {"session_id": session_id, "group": session.group, "closed": session.closed, "turns": session.calls,
                "encoded_tokens": history.encoded_tokens, "metadata": session.metadata,
                "segments": [{"tokens": list(s.tokens), "mask": list(s.mask)} for s in history.segments],
                "weight_versions": [t.weight_version for t in session.trajectory.turns]}

    def models(self, session_id: str) -> dict[str, Any]:
        self.table.get(session_id)
        return {"object": "list", "data": [{"id": POLICY_MODEL, "object": "model", "owned_by": "rose"}]}

    # ---------------------------------------------------------------- calls

    def chat(self, session_id: str, body: bytes) -> tuple[ChatRequest, Reply]:
        started = time.perf_counter()
        req: ChatRequest = decode(body, ChatRequest, "chat completion")
        max_tokens = check_sampling(req, self.limits.max_tokens)
        check_chat(req)
        if self.template is None:
            raise GatewayError(400, "the policy has no chat template: use /v1/completions, or give the policy's "
                                    "tokenizer a chat_template")
        template = self.template
        rendered = template.render(req.messages, req.tools)
        parser = self.parser if self.parser is not None and self.parser.applies(req.tools, req.tool_choice) else None
        parse_request = None if parser is None else parser.request(msgspec.structs.asdict(req))

        def build(history: SessionHistory) -> list[int]:
            return history.prompt_for_text(rendered, self.codec.encode)

        def key(ids: list[int], text: str) -> str | None:
            ended = bool(ids) and ids[-1] == self.codec.eos_id
            said = text if parser is None else parser.text(ids[:-1] if ended else ids)
            return rendered + said + (template.eos_text if ended else "")

        reply = self._call(session_id, build, key, max_tokens, req, started)
        if parser is not None:
            said = reply.token_ids[:-1] if reply.token_ids[-1:] == [self.codec.eos_id] else reply.token_ids
            stops = stop_strings(req.stop)
            reply.parsed = parser.parse(parse_request, said, stops)
            reply.deltas = list(parser.deltas(parse_request, reply.prompt, said, stops)) if req.stream else []
            if reply.parsed.tool_calls:
                reply.finish_reason = "tool_calls"
        return req, reply

    def completion(self, session_id: str, body: bytes) -> tuple[CompletionRequest, Reply]:
        started = time.perf_counter()
        req: CompletionRequest = decode(body, CompletionRequest, "completion")
        max_tokens = check_sampling(req, self.limits.max_tokens)
        check_completion(req)
        prompt = req.prompt

        def build(history: SessionHistory) -> list[int]:
            if isinstance(prompt, str):
                return history.prompt_for_text(prompt, self.codec.encode)
            return history.prompt_for_tokens(prompt)

        def key(ids: list[int], text: str) -> str | None:
            ended = bool(ids) and ids[-1] == self.codec.eos_id
            return prompt + text if isinstance(prompt, str) and not ended else None

        return req, self._call(session_id, build, key, max_tokens, req, started)

    def _call(self, session_id: str, build: Any, key: Any, max_tokens: int, req: Any, started: float) -> Reply:
        prompt = self.table.begin_call(session_id, build)
        try:
            self._check_prompt(prompt)
            sampling = SamplingParams(max_tokens=max_tokens, logprobs=True,
                                      temperature=self.limits.temperature if req.temperature is None else req.temperature,
                                      top_p=1.0 if req.top_p is None else req.top_p, stop=stop_strings(req.stop),
                                      top_logprobs=top_logprobs(req))
            submitted = time.perf_counter()
            outcome = self._run(GatewayTurn(f"{session_id}/c{next(self._calls)}", session_id, prompt, sampling))
            turn_s = time.perf_counter() - submitted
            result = outcome.result
            ids = [int(t) for t in result.output_token_ids]
            logprobs = [float(x) for x in result.output_logprobs]
            said = self.codec.decode(ids[:-1] if ids and ids[-1] == self.codec.eos_id else ids)
            turn = Turn(tuple(prompt), tuple(ids), tuple(logprobs), result.weight_version,
                        temperature=sampling.temperature, top_p=sampling.top_p)
            self.table.finish_call(session_id, turn, key(ids, said))
        except BaseException:  # whatever fails before the turn is recorded, the session is not left busy
            self.table.fail_call(session_id)
            raise
        text = cut_at_stop(said, sampling.stop)
        finish = "length" if result.finish_reason == "length" else "stop"
        return Reply(session_id, len(prompt), ids, logprobs, text, finish, outcome, started, turn_s, list(prompt))

    def _check_prompt(self, prompt: Sequence[int]) -> None:
        if len(prompt) > self.limits.max_prompt_tokens:
            raise GatewayError(400, f"the prompt is {len(prompt)} tokens, over the policy's context of "
                                    f"{self.limits.max_prompt_tokens} (rl.max_context_tokens): shorten the history "
                                    "or raise it", "messages", "context_length_exceeded")
        if any(not 0 <= t < 2**31 for t in prompt):
            raise GatewayError(400, "prompt token ids must be in [0, 2**31)", "prompt")

    def _run(self, turn: GatewayTurn) -> TurnOutcome:
        future = self.bridge.submit(turn)
        try:
            return future.result(timeout=self.limits.turn_timeout_s)
        except BridgeClosed as exc:
            raise GatewayError(503, "the RL job is stopping: no more turns are run", kind="unavailable") from exc
        except TurnFailed as exc:
            raise GatewayError(502, f"the turn failed on the job's executors ({exc}) and was given up "
                                    "(scheduler.turn_retries): retry the call", kind="upstream_error") from exc
        except FutureTimeout as exc:
            self.bridge.abandon(turn)  # withdrawn from the controller: no executor keeps running it
            raise GatewayError(504, f"the turn did not finish within {self.limits.turn_timeout_s:.0f} s "
                                    "(gateway.turn_timeout_s): retry the call", kind="timeout") from exc

    # ---------------------------------------------------------------- responses

    def chat_response(self, req: ChatRequest, reply: Reply) -> dict[str, Any]:
        choice = {"index": 0, "message": _message(reply),
                  "finish_reason": reply.finish_reason, "token_ids": reply.token_ids,
                  "logprobs": self._chat_logprobs(reply) if req.logprobs else None}
        return self._envelope("chat.completion", reply, [choice])

    def completion_response(self, req: CompletionRequest, reply: Reply) -> dict[str, Any]:
        choice = {"index": 0, "text": reply.text, "finish_reason": reply.finish_reason, "token_ids": reply.token_ids,
                  "logprobs": self._text_logprobs(reply) if req.logprobs is not None else None}
        return self._envelope("text_completion", reply, [choice])

    def chat_chunks(self, req: ChatRequest, reply: Reply) -> Iterator[dict[str, Any]]:
        """The streamed form: the whole reply in one delta (executors return whole turns), or, parsed, a first
        delta with the reply's tokens and then the parser's deltas; then the finish."""
        first = {"index": 0, "delta": {"role": "assistant", "content": reply.text if reply.parsed is None else ""},
                 "finish_reason": None, "token_ids": reply.token_ids,
                 "logprobs": self._chat_logprobs(reply) if req.logprobs else None}
        yield self._envelope("chat.completion.chunk", reply, [first], usage=False)
        for delta in reply.deltas:
            yield self._envelope("chat.completion.chunk", reply, [{"index": 0, "delta": delta, "finish_reason": None}],
                                 usage=False)
        yield self._envelope("chat.completion.chunk", reply, [{"index": 0, "delta": {},
                                                                "finish_reason": reply.finish_reason}], usage=False)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield self._envelope("chat.completion.chunk", reply, [])

    def completion_chunks(self, req: CompletionRequest, reply: Reply) -> Iterator[dict[str, Any]]:
        first = {"index": 0, "text": reply.text, "finish_reason": reply.finish_reason, "token_ids": reply.token_ids,
                 "logprobs": self._text_logprobs(reply) if req.logprobs is not None else None}
        yield self._envelope("text_completion", reply, [first], usage=False)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield self._envelope("text_completion", reply, [])

    def _envelope(self, kind: str, reply: Reply, choices: list[dict[str, Any]], *, usage: bool = True
                  ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": f"rose-{reply.outcome.result.turn_id}", "object": kind, "created": int(time.time()),
            "model": POLICY_MODEL, "choices": choices, "rose_weight_version": reply.outcome.result.weight_version,
            "rose_pool": reply.outcome.role, "rose_executor": reply.outcome.result.executor_id,
            "rose_timing": _timing(reply),
        }
        if usage:
            out["usage"] = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": len(reply.token_ids),
                            "total_tokens": reply.prompt_tokens + len(reply.token_ids)}
        return out

    def _token_texts(self, ids: Sequence[int]) -> list[str]:
        return [self.codec.decode([t]) for t in ids]

    def _chat_logprobs(self, reply: Reply) -> dict[str, Any]:
        tops = self._tops(reply)
        return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                             "top_logprobs": [{"token": t, "logprob": x, "bytes": list(t.encode())} for t, x in top]}
                            for tok, lp, top in zip(self._token_texts(reply.token_ids), reply.logprobs, tops,
                                                    strict=True)]}

    def _text_logprobs(self, reply: Reply) -> dict[str, Any]:
        tokens = self._token_texts(reply.token_ids)
        offsets = list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)) if tokens else []
        result = reply.outcome.result
        tops = [_by_text(top) for top in self._tops(reply)] if result.top_token_ids is not None else None
        return {"tokens": tokens, "token_logprobs": reply.logprobs, "top_logprobs": tops, "text_offset": offsets}

    def _tops(self, reply: Reply) -> list[list[tuple[str, float]]]:
        """Each sampled token's alternatives as (text, logprob), likeliest first; -inf (outside the top-p
        nucleus) as -9999.0, as vLLM's server sends it (JSON has no infinity)."""
        result = reply.outcome.result
        if result.top_token_ids is None or result.top_logprobs is None:
            return [[] for _ in reply.token_ids]
        return [[(self.codec.decode([int(t)]), max(float(x), -9999.0)) for t, x in zip(ids, lps, strict=True)]
                for ids, lps in zip(result.top_token_ids, result.top_logprobs, strict=True)]


def _by_text(top: list[tuple[str, float]]) -> dict[str, float]:
    """Alternatives as completions' ``{text: logprob}``, likeliest first; of two with one text, the likelier."""
    out: dict[str, float] = {}
    for text, logprob in top:
        out.setdefault(text, logprob)
    return out


def _message(reply: Reply) -> dict[str, Any]:
    """The reply's assistant message: its text, or what vLLM's parsers made of it (content, reasoning,
    tool calls)."""
    parsed = reply.parsed
    if parsed is None:
        return {"role": "assistant", "content": reply.text}
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        message["reasoning"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    return message


def _timing(reply: Reply) -> dict[str, float]:
    """Where the call's time went, in seconds: ``gateway`` (HTTP body to response, the turn excluded),
    ``route`` (hand-off, scheduling and the control plane both ways: the turn minus the executor's part),
    ``queue`` (admission on the executor) and ``engine`` (the engine call itself)."""
    result = reply.outcome.result
    return {"gateway_s": time.perf_counter() - reply.started - reply.turn_s,
            "route_s": max(0.0, reply.turn_s - result.run_seconds - result.queue_seconds),
            "queue_s": result.queue_seconds, "engine_s": result.run_seconds}
