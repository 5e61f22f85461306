"""Tool calls and reasoning in the policy's replies, parsed by vLLM's own parsers: the gateway's one vLLM importer.

``[gateway] tool_parser`` / ``reasoning_parser`` take the names ``vllm serve --tool-call-parser`` /
``--reasoning-parser`` take (``hermes`` for Qwen2.5 and Hermes, ``llama3_json``, ``mistral``, ``qwen3_coder``,
``deepseek_r1``...), and the parsing is vLLM's: ``vllm.parser.parser_manager.ParserManager`` composes the two
into the same per-request ``Parser`` vLLM's OpenAI server builds, fed the same ``ChatCompletionRequest``.
Parsing runs here, in the gateway (decision 328): it is frontend work in vLLM too (its API server, not its
engine), it needs the call's tools and messages, which only the gateway has, and it leaves the executors'
token-in, token-out turns untouched. vLLM is imported only when a parser is configured, and the gateway's host
then needs it installed (``rose-executor[cpu]`` or ``vllm``).

A reply is parsed from the text of *every* sampled token but the end-of-turn one, special tokens included
(vLLM's parsers ask for ``skip_special_tokens = False`` for the same reason: some models' tool-call tags are
special tokens). Streaming replays the reply token by token through the parser's streaming path, since
executors return whole turns: the deltas are the ones ``vllm serve`` would send for the same tokens.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rose_core.app.gateway.openai_api import POLICY_MODEL, GatewayError, cut_at_stop
from rose_core.support.errors import ConfigError, require_extra

VLLM_EXTRA = "vllm (rose-executor[cpu] on a CPU host, rose-executor[gpu] on a GPU one)"


@dataclass(slots=True)
class ParsedReply:
    """What a whole reply says: ``content`` (None when it is only tool calls), ``reasoning``, ``tool_calls``
    in OpenAI's shape (``id``, ``type``, ``function.name``, ``function.arguments`` as a JSON string)."""

    content: str | None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ReplyParser:
    """One configured pair of vLLM parsers over the policy's tokenizer (checked against it when built, as
    ``vllm serve`` does at start-up)."""

    def __init__(self, tool_parser: str, reasoning_parser: str, tokenizer: Any) -> None:
        with require_extra("vllm", VLLM_EXTRA):
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
            from vllm.parser.parser_manager import ParserManager
        self._request_type = ChatCompletionRequest
        self._tokenizer = tokenizer
        self.tools = bool(tool_parser)
        try:
            parser_cls = ParserManager.get_parser(tool_parser_name=tool_parser or None,
                                                  reasoning_parser_name=reasoning_parser or None,
                                                  enable_auto_tools=bool(tool_parser), tokenizer=tokenizer)
        except TypeError as exc:  # an unknown name, or a tokenizer the parser cannot use
            raise ConfigError(f"[gateway] tool_parser = {tool_parser!r}, reasoning_parser = {reasoning_parser!r}: "
                              f"{exc} (the names `vllm serve --tool-call-parser / --reasoning-parser` take)") from exc
        if parser_cls is None:
            raise ConfigError("ReplyParser needs a tool_parser or a reasoning_parser")
        self._parser_cls = parser_cls
        self._reasoning_cls = (ParserManager.get_parser(reasoning_parser_name=reasoning_parser, tokenizer=tokenizer)
                               if tool_parser and reasoning_parser else None)
        """Both parsers set: the reasoning one alone, for calls whose tool calls are not extracted."""

    def applies(self, tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any) -> bool:
        """Whether a call is parsed: always with a reasoning parser; with a tool parser only, when it sends
        tools and does not say ``tool_choice = "none"``."""
        return not self.tools or self._parser_cls.reasoning_parser_cls is not None or (
            bool(tools) and tool_choice != "none")

    def _parser_for(self, request: Any) -> Any:
        """A fresh per-call parser (they keep streaming state): the reasoning one alone when this call's tool
        calls are not extracted and both are set."""
        calls_tools = self._calls_tools(request)
        cls = self._parser_cls if calls_tools or self._reasoning_cls is None else self._reasoning_cls
        return cls(self._tokenizer, request.tools if calls_tools else None)

    def _calls_tools(self, request: Any) -> bool:
        """Tool calls are extracted when a tool parser is set and the call sends tools without ``tool_choice =
        "none"`` (with only reasoning parsed, a reply's tool-call text stays content, as in ``vllm serve``)."""
        return self.tools and bool(request.tools) and request.tool_choice != "none"

    def text(self, ids: Sequence[int]) -> str:
        """The text of sampled tokens as the parsers read it (special tokens kept)."""
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def request(self, body: Mapping[str, Any]) -> Any:
        """vLLM's own request model of the call (what its parsers read: tools, tool_choice, messages)."""
        fields = {key: body[key] for key in ("messages", "tools", "tool_choice", "parallel_tool_calls")
                  if body.get(key) not in (None, [])}  # no tools at all is what an empty list means
        try:
            return self._request_type.model_validate({**fields, "model": POLICY_MODEL})
        except Exception as exc:  # pydantic's ValidationError and vLLM's own checks: the call's fault, named
            raise GatewayError(400, f"the call's messages or tools are not OpenAI chat completion ones: {exc}",
                               "messages") from exc

    def parse(self, request: Any, ids: Sequence[int], stops: tuple[str, ...] = ()) -> ParsedReply:
        """A whole reply (``ids`` without the end-of-turn token; its text cut at the first of ``stops``)."""
        parser = self._parser_for(request)
        reasoning, content, calls = parser.parse(cut_at_stop(self.text(ids), stops), request,
                                                 enable_auto_tools=self._calls_tools(request),
                                                 model_output_token_ids=list(ids))
        return ParsedReply(content=content, reasoning=reasoning, tool_calls=[_tool_call(c) for c in calls or []])

    def deltas(self, request: Any, prompt: Sequence[int], ids: Sequence[int], stops: tuple[str, ...] = ()
               ) -> Iterator[dict[str, Any]]:
        """The reply as ``vllm serve`` streams it: one delta per token the parser releases (content,
        reasoning or tool-call fragments: OpenAI's ``choices[0].delta`` shape), the text ending at the first of
        ``stops``."""
        parser = self._parser_for(request)
        whole = cut_at_stop(self.text(ids), stops)
        sent, fed = "", 0
        for end in range(1, len(ids) + 1):
            text = self.text(ids[:end])[: len(whole)]
            if text.endswith("\ufffd") and end < len(ids):  # a character split across tokens: wait for the rest
                continue
            delta = parser.parse_delta(text[len(sent):], list(ids[fed:end]), request, list(prompt),
                                       finished=end == len(ids))
            sent, fed = text, end
            if delta is None:
                continue
            dumped = delta.model_dump(exclude_none=True)
            if dumped.get("content") or dumped.get("reasoning") or dumped.get("tool_calls"):
                yield dumped


def _tool_call(call: Any) -> dict[str, Any]:
    from vllm.renderers.chat_utils import make_tool_call_id

    return {"id": call.id or make_tool_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}
