"""The gateway's tool calls, parsed by vLLM's own ``hermes`` parser over a Qwen-templated tokenizer (the tool
policy's, ``tests/tool_policy.py``): a whole reply, the same reply streamed as deltas, the session's tokens
(the tool's result masked as prompt), ``tool_choice = "none"``, a parser name vLLM does not have refused at
start. The turn is answered by a twin of the controller (the reply's token ids, canned); the real engine
plays it in ``tests/integration/test_rose_run_gateway.py``. Here because vLLM is installed here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rose_core.app.gateway.chat_template import ChatTemplate
from rose_core.app.gateway.gateway import Gateway, GatewayLimits
from rose_core.app.gateway.openai_api import GatewayError
from rose_core.app.gateway.reply_parser import ReplyParser
from rose_core.app.gateway.session_table import SessionTable
from rose_core.app.gateway.turn_bridge import TurnBridge, TurnOutcome
from rose_core.app.rl.demo.models import load_tokenizer
from rose_core.protocol.messages import TurnResult
from rose_core.support.errors import ConfigError
from tool_policy import ADD_TOOL, ARGUMENTS, IM_END, QUESTION, answer_text, call_text, sampled_runs, save_tool_tokenizer


class Policy:
    """Answers each turn with the next canned reply (its tokens and the end-of-turn token)."""

    def __init__(self, bridge: TurnBridge, codec: Any, replies: list[str]) -> None:
        self.bridge, self.codec, self.replies = bridge, codec, list(replies)

    def __call__(self) -> None:
        for turn in self.bridge.take():
            ids = [*self.codec.encode(self.replies.pop(0)), self.codec.eos_id]
            self.bridge.resolve(TurnOutcome(TurnResult(
                turn_id=turn.turn_id, trajectory_id=turn.session_id, attempt=0, executor_id="twin", weight_version=0,
                output_token_ids=np.array(ids, dtype=np.int32), output_logprobs=np.full(len(ids), -0.1),
                finish_reason="stop"), "dedicated"))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tool_tokenizer(tmp_path_factory.mktemp("tool-tokenizer"))


def gateway(tokenizer_dir: Path, replies: list[str], tool_parser: str = "hermes", reasoning_parser: str = "") -> Gateway:
    codec = load_tokenizer(tokenizer_dir)
    bridge = TurnBridge()
    bridge._wake = Policy(bridge, codec, replies)  # the controller's wake-up: here, the twin answers at once
    template = ChatTemplate(tokenizer_dir)
    return Gateway(SessionTable(group_size=1), bridge, codec, template,
                   GatewayLimits(max_prompt_tokens=2048, max_tokens=64, temperature=1.0, turn_timeout_s=5.0),
                   parser=ReplyParser(tool_parser, reasoning_parser, template.tokenizer))


def body(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"model": "policy", "messages": messages, "tools": [ADD_TOOL], **extra}).encode()


ASKED = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": QUESTION}]


def test_a_reply_that_calls_a_tool_carries_the_call_and_the_result_goes_back_as_prompt(tokenizer_dir: Path) -> None:
    gw = gateway(tokenizer_dir, [call_text(), answer_text()])
    sid = gw.open_session(b'{"group": "g"}')["session_id"]
    reply = gw.chat_response(*gw.chat(sid, body(ASKED)))
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"] and call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == ARGUMENTS

    called = [*ASKED, {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "tool_call_id": call["id"], "content": "5"}]
    second = gw.chat_response(*gw.chat(sid, body(called)))["choices"][0]
    assert second["finish_reason"] == "stop" and second["message"] == {"role": "assistant", "content": answer_text()}
    (segment,) = gw.describe(sid)["segments"]  # the call rendered back exactly as sampled: one sequence
    codec = load_tokenizer(tokenizer_dir)
    (call_start, call_end), (answer_start, answer_end) = sampled_runs(segment["mask"])
    tokens = segment["tokens"]
    assert codec.decode(tokens[call_start:call_end]) == call_text()  # the end-of-turn token, sampled, is special
    assert codec.decode(tokens[answer_start:answer_end]) == answer_text()
    between = codec.decode(tokens[call_end:answer_start])  # all prompt (mask 0): the tool's result among it
    assert "<tool_response>\n5\n</tool_response>" in between and between.endswith("assistant\n")


def test_the_same_call_streams_as_deltas(tokenizer_dir: Path) -> None:
    gw = gateway(tokenizer_dir, [call_text()])
    sid = gw.open_session(b'{"group": "g"}')["session_id"]
    chunks = list(gw.chat_chunks(*gw.chat(sid, body(ASKED, stream=True))))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""} and chunks[0]["choices"][0]["token_ids"]
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert calls[0]["function"]["name"] == "add" and calls[0]["id"] and calls[0]["index"] == 0
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls)) == ARGUMENTS
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_choice_none_and_plain_text_are_not_calls(tokenizer_dir: Path) -> None:
    gw = gateway(tokenizer_dir, [call_text(), answer_text()])
    sid = gw.open_session(b'{"group": "g"}')["session_id"]
    unparsed = gw.chat_response(*gw.chat(sid, body(ASKED, tool_choice="none")))["choices"][0]
    assert unparsed["finish_reason"] == "stop" and "tool_calls" not in unparsed["message"]
    sid = gw.open_session(b'{"group": "h"}')["session_id"]
    text = gw.chat_response(*gw.chat(sid, body(ASKED)))["choices"][0]  # the second canned reply: words
    assert text["message"] == {"role": "assistant", "content": answer_text()} and text["finish_reason"] == "stop"


def test_a_call_vllm_cannot_read_is_a_400_before_any_turn(tokenizer_dir: Path) -> None:
    gw = gateway(tokenizer_dir, [])
    sid = gw.open_session(b'{"group": "g"}')["session_id"]
    bad_tools = json.dumps({"model": "policy", "messages": ASKED, "tools": [{"type": "function"}]}).encode()
    with pytest.raises(GatewayError) as refused:
        gw.chat(sid, bad_tools)
    assert refused.value.status == 400 and "tools" in refused.value.message
    assert gw.describe(sid)["turns"] == 0


def test_a_parser_vllm_does_not_have_is_refused_at_start(tokenizer_dir: Path) -> None:
    template = ChatTemplate(tokenizer_dir)
    with pytest.raises(ConfigError, match="no_such_parser"):
        ReplyParser("no_such_parser", "", template.tokenizer)
    assert template.eos_text == IM_END  # the policy's end-of-turn token is Qwen's


def test_a_stop_string_cuts_the_reply_and_the_session_keeps_every_sampled_token(tokenizer_dir: Path) -> None:
    """The engine ends the turn at the token that completes a stop string; the reply's text ends before it (as
    OpenAI's API returns it), the session keeps the tokens as sampled."""
    gw = gateway(tokenizer_dir, [answer_text()])
    sid = gw.open_session(b'{"group": "g"}')["session_id"]
    req, reply = gw.chat(sid, body(ASKED, stop=[" is"], tool_choice="none"))
    assert gw.chat_response(req, reply)["choices"][0]["message"]["content"] == "The sum"
    codec = load_tokenizer(tokenizer_dir)
    (segment,) = gw.describe(sid)["segments"]
    (start, end), = sampled_runs(segment["mask"])
    assert codec.decode(segment["tokens"][start:end]) == answer_text()


def test_reasoning_is_split_from_the_content_by_vllms_reasoning_parser(tokenizer_dir: Path) -> None:
    """``reasoning_parser = "qwen3"`` beside ``hermes``: a ``<think>`` block becomes ``reasoning``, whole and
    streamed; a call that sends ``tools: []`` is a call without tools, not an error."""
    thought = f"<think>\nadd them\n</think>\n\n{answer_text()}"
    gw = gateway(tokenizer_dir, [thought, thought], reasoning_parser="qwen3")
    sid = gw.open_session(b'{"group": "g"}')["session_id"]
    message = gw.chat_response(*gw.chat(sid, body(ASKED, tools=[])))["choices"][0]["message"]
    assert message["reasoning"].strip() == "add them" and message["content"].strip() == answer_text()
    sid = gw.open_session(b'{"group": "h"}')["session_id"]
    deltas = [c["choices"][0]["delta"] for c in gw.chat_chunks(*gw.chat(sid, body(ASKED, stream=True)))]
    assert "".join(d.get("reasoning", "") for d in deltas).strip() == "add them"
    assert "".join(d.get("content", "") for d in deltas).strip() == answer_text()


def test_with_both_parsers_tool_choice_none_leaves_the_call_as_text_whole_and_streamed(tokenizer_dir: Path) -> None:
    gw = gateway(tokenizer_dir, [call_text(), call_text()], reasoning_parser="qwen3")
    for group, stream in (("g", False), ("h", True)):
        sid = gw.open_session(b'{"group": "%s"}' % group.encode())["session_id"]
        req, reply = gw.chat(sid, body(ASKED, tool_choice="none", stream=stream))
        if stream:
            deltas = [c["choices"][0]["delta"] for c in gw.chat_chunks(req, reply)]
            assert not any(d.get("tool_calls") for d in deltas)
            assert "".join(d.get("content", "") for d in deltas) == call_text()
        else:
            message = gw.chat_response(req, reply)["choices"][0]["message"]
            assert "tool_calls" not in message and message["content"] == call_text()
