"""The gateway's pure parts: a session's token history (extension by text or ids, restarts, undo), the session
table (groups, one call at a time, closing, taking), the turn bridge (hand-off, close) and the request
checks."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_core.app.gateway.openai_api import (
    ChatRequest,
    CompletionRequest,
    GatewayError,
    check_chat,
    check_sampling,
    cut_at_stop,
    decode,
    stop_strings,
)
from rose_core.app.gateway.session_history import SessionHistory
from rose_core.app.gateway.session_table import SessionTable
from rose_core.app.gateway.turn_bridge import BridgeClosed, GatewayTurn, TurnBridge, TurnOutcome
from rose_core.app.rl.algorithm.trajectory import Turn
from rose_core.protocol.messages import SamplingParams, TurnResult


def encode(text: str) -> list[int]:
    """One id per character (the tests count what was tokenised)."""
    return [ord(c) for c in text]


def test_a_call_that_extends_the_key_tokenises_only_the_new_text() -> None:
    history = SessionHistory()
    assert history.prompt_for_text("<u>hi", encode) == encode("<u>hi")
    history.add_reply([900, 901], key="<u>hi" + "ok")
    prompt = history.prompt_for_text("<u>hiok<u>more", encode)
    assert prompt == [*encode("<u>hi"), 900, 901, *encode("<u>more")]
    assert history.encoded_tokens == len("<u>hi") + len("<u>more")
    assert history.segments[0].mask == [0] * 5 + [1, 1] + [0] * 7


def test_a_call_that_rewrites_the_history_starts_a_new_segment() -> None:
    history = SessionHistory()
    history.prompt_for_text("abc", encode)
    history.add_reply([7], key="abcX")
    assert history.prompt_for_text("zzz", encode) == encode("zzz")
    assert len(history.segments) == 2 and history.segments[0].tokens == [*encode("abc"), 7]


def test_a_reply_without_a_key_makes_the_next_call_start_over() -> None:
    history = SessionHistory()
    history.prompt_for_text("abc", encode)
    history.add_reply([7], key=None)
    history.prompt_for_text("abcX", encode)
    assert len(history.segments) == 2


def test_token_prompts_extend_exactly_without_tokenising() -> None:
    history = SessionHistory()
    assert history.prompt_for_tokens([1, 2, 3]) == [1, 2, 3]
    history.add_reply([4], key=None)
    assert history.prompt_for_tokens([1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5]
    assert history.segments[0].mask == [0, 0, 0, 1, 0] and history.encoded_tokens == 0
    history.add_reply([6], key=None)
    assert history.prompt_for_tokens([9]) == [9] and len(history.segments) == 2


def test_a_failed_call_gives_its_prompt_tokens_back() -> None:
    history = SessionHistory()
    history.prompt_for_text("ab", encode)
    history.add_reply([5], key="abY")
    history.prompt_for_text("abYcd", encode)
    history.drop_pending()
    assert history.segments[0].tokens == [*encode("ab"), 5] and history.key == "abY"
    history.prompt_for_text("new", encode)  # a restart that fails: the previous segment is current again
    history.drop_pending()
    assert len(history.segments) == 1 and history.prompt_for_text("abYe", encode)[-1] == ord("e")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text("abc<>", min_size=1, max_size=6), st.lists(st.integers(900, 999), min_size=1,
                                                                              max_size=4)), min_size=1, max_size=8))
def test_an_extending_conversation_is_one_segment_whose_mask_marks_exactly_the_replies(
        turns: list[tuple[str, list[int]]]) -> None:
    history, rendered = SessionHistory(), ""
    expected: list[int] = []
    mask: list[int] = []
    for user, reply in turns:
        rendered += user
        prompt = history.prompt_for_text(rendered, encode)
        expected += encode(user)
        mask += [0] * len(user)
        assert prompt == expected
        text = "".join(chr(t) for t in reply)
        rendered += text
        history.add_reply(reply, key=rendered)
        expected += reply
        mask += [1] * len(reply)
    (segment,) = history.segments
    assert segment.tokens == expected and segment.mask == mask
    assert history.encoded_tokens == sum(len(u) for u, _ in turns)  # never the history again


def _turn(tokens: int = 2) -> Turn:
    return Turn(prompt_token_ids=(1, 2), response_token_ids=tuple(range(3, 3 + tokens)),
                behaviour_logprobs=(-0.5,) * tokens, weight_version=0)


def test_groups_complete_when_group_size_sessions_are_closed_and_leave_when_taken() -> None:
    table = SessionTable(group_size=2)
    a, b = table.open("g", {}), table.open("g", {"task": 3})
    with pytest.raises(GatewayError, match="already has its 2 sessions") as full:
        table.open("g", {})
    assert full.value.status == 409
    for session in (a, b):
        table.begin_call(session.session_id, lambda h: h.prompt_for_tokens([1, 2]))
        table.finish_call(session.session_id, _turn(), key=None)
    table.close(a.session_id, 1.0, None)
    assert table.take_groups(5) == []
    table.close(b.session_id, 0.0, None)
    (group,) = table.take_groups(5)
    assert [t.total_reward for t in group] == [1.0, 0.0] and [t.success for t in group] == [True, False]
    assert group[0].group_id == group[1].group_id and len(group[0].turns) == 1
    with pytest.raises(GatewayError, match="unknown session") as gone:
        table.get(a.session_id)
    assert gone.value.status == 404


def test_one_call_at_a_time_and_no_reward_while_one_runs_or_before_any() -> None:
    table = SessionTable(group_size=2)
    s = table.open("g", {})
    with pytest.raises(GatewayError, match="made no call"):
        table.close(s.session_id, 1.0, None)
    table.begin_call(s.session_id, lambda h: h.prompt_for_tokens([1]))
    with pytest.raises(GatewayError, match="call in flight") as busy:
        table.begin_call(s.session_id, lambda h: h.prompt_for_tokens([1]))
    assert busy.value.status == 409
    with pytest.raises(GatewayError, match="call in flight"):
        table.close(s.session_id, 1.0, None)
    table.fail_call(s.session_id)
    assert table.get(s.session_id).history.segments == []
    table.begin_call(s.session_id, lambda h: h.prompt_for_tokens([1]))
    table.finish_call(s.session_id, _turn(), None)
    table.close(s.session_id, 0.5, None)
    with pytest.raises(GatewayError, match="is closed"):
        table.begin_call(s.session_id, lambda h: h.prompt_for_tokens([1]))


def test_sessions_opened_from_many_threads_fill_each_group_exactly() -> None:
    table = SessionTable(group_size=4)
    refused = []

    def open_some() -> None:
        for _ in range(8):
            try:
                table.open("g", {})
            except GatewayError:
                refused.append(1)

    threads = [threading.Thread(target=open_some) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert table.counts() == (4, 0) and len(refused) == 28


def _result(turn_id: str) -> TurnResult:
    return TurnResult(turn_id=turn_id, trajectory_id="s", attempt=0, executor_id="e", weight_version=3,
                      output_token_ids=np.array([5], dtype=np.int32), output_logprobs=np.array([-0.1]),
                      finish_reason="stop")


def test_the_bridge_hands_turns_over_wakes_the_controller_and_resolves_them() -> None:
    woken = []
    bridge = TurnBridge(lambda: woken.append(1))
    future = bridge.submit(GatewayTurn("s/c0", "s", [1, 2], SamplingParams()))
    assert woken == [1] and [t.turn_id for t in bridge.take()] == ["s/c0"] and bridge.is_gateway_turn("s/c0")
    assert bridge.resolve(TurnOutcome(_result("s/c0"), "serving"))
    assert future.result(timeout=1).role == "serving"
    assert not bridge.resolve(TurnOutcome(_result("s/c0"), "serving"))  # a late duplicate: no one waits


def test_closing_the_bridge_fails_every_waiting_and_later_call() -> None:
    bridge = TurnBridge()
    running = bridge.submit(GatewayTurn("a", "s", [1], SamplingParams()))
    bridge.take()
    waiting = bridge.submit(GatewayTurn("b", "s", [1], SamplingParams()))
    bridge.close()
    later = bridge.submit(GatewayTurn("c", "s", [1], SamplingParams()))
    for future in (running, waiting, later):
        with pytest.raises(BridgeClosed):
            future.result(timeout=1)


def test_request_checks_name_the_field() -> None:
    chat = decode(b'{"messages": [{"role": "user", "content": "x"}]}', ChatRequest, "chat")
    assert check_sampling(chat, 64) == 64
    assert check_sampling(decode(b'{"messages": [], "stop": ["x", "\\n"]}', ChatRequest, "chat"), 64) == 64
    assert stop_strings("x") == ("x",) and stop_strings(None) == ()
    assert cut_at_stop("one. two. three", (" three", ".")) == "one" and cut_at_stop("abc", ("z",)) == "abc"
    for body, field in ((b'{"messages": [], "n": 2}', "n"), (b'{"messages": [], "max_tokens": 65}', "max_tokens"),
                        (b'{"messages": [], "model": "gpt-4"}', "model"), (b'{"messages": [], "stop": ["a", "b", "c", "d", "e"]}', "stop"),
                        (b'{"messages": [], "stop": [""]}', "stop"),
                        (b'{"messages": [], "temperature": 3}', "temperature")):
        with pytest.raises(GatewayError) as refused:
            check_sampling(decode(body, ChatRequest, "chat"), 64)
        assert refused.value.param == field and 400 <= refused.value.status < 500
    with pytest.raises(GatewayError, match="has no role"):
        check_chat(decode(b'{"messages": [{"content": "x"}]}', ChatRequest, "chat"))
    with pytest.raises(GatewayError, match="text parts"):
        check_chat(decode(b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', ChatRequest, "c"))
    with pytest.raises(GatewayError, match="malformed JSON"):
        decode(b"{nope", CompletionRequest, "completion")
    with pytest.raises(GatewayError, match="invalid completion body") as typed:
        decode(b'{"prompt": 5}', CompletionRequest, "completion")
    assert typed.value.param == "prompt"


def test_complete_groups_are_journaled_until_dropped_and_a_new_table_takes_them_back(tmp_path) -> None:
    """A controller that restarts (``--resume``) finds the complete groups a checkpoint did not cover yet: the
    table writes each one whole when its last reward closes it; a later process recovers them (and the
    directory is emptied), restores them as complete, and takes the same trajectories; dropped groups are gone."""
    from rose_core.app.gateway.group_journal import GroupJournal
    from rose_core.app.gateway.session_table import serial_of

    journal = GroupJournal(tmp_path / "groups")
    table = SessionTable(group_size=2, journal=journal)
    for name in ("first", "second", "open"):
        for member in range(2 if name != "open" else 1):
            sid = table.open(name, {}).session_id
            table.begin_call(sid, lambda history: history.prompt_for_tokens([1, 2]))
            table.finish_call(sid, _turn(), key=None)
            if name != "open":
                table.close(sid, reward=float(member), success=None)
    first, second = table.take_groups(2)
    journal.drop([serial_of(first[0])])  # a checkpoint covered the step that trained "first"

    (recovered,) = GroupJournal(tmp_path / "groups").recover()  # the restarted process
    assert recovered.name == "second" and not list((tmp_path / "groups").iterdir())
    restarted = SessionTable(group_size=2, first_serial=recovered.serial)
    for _ in range(2):  # an agent completes a group of the same name before the restored one is back
        sid = restarted.open("second", {}).session_id
        restarted.begin_call(sid, lambda history: history.prompt_for_tokens([1, 2]))
        restarted.finish_call(sid, _turn(), key=None)
        restarted.close(sid, reward=1.0, success=None)
    restarted.restore([recovered])
    again, newer = restarted.take_groups(5)  # the restored group first: it is older
    assert [(t.trajectory_id, t.total_reward, t.turns) for t in again] == \
        [(t.trajectory_id, t.total_reward, t.turns) for t in second]
    assert serial_of(newer[0]) > recovered.serial and newer[0].trajectory_id not in {t.trajectory_id for t in again}


def test_an_unreadable_journal_file_is_skipped(tmp_path) -> None:
    from rose_core.app.gateway.group_journal import GroupJournal

    (tmp_path / "000000000001.msgpack").write_bytes(b"\x00not msgpack")
    assert GroupJournal(tmp_path).recover() == [] and not list(tmp_path.iterdir())


def test_a_turn_whose_caller_stopped_waiting_is_withdrawn_once_taken_and_never_taken_otherwise() -> None:
    bridge = TurnBridge()
    taken = GatewayTurn("s/c0", "s", [1], SamplingParams())
    bridge.submit(taken)
    assert [t.turn_id for t in bridge.take()] == ["s/c0"]
    waiting = GatewayTurn("s/c1", "s", [1], SamplingParams())
    bridge.submit(waiting)
    bridge.abandon(taken)  # its call timed out while it ran: the controller withdraws it
    bridge.abandon(waiting)  # timed out before the controller took it: it is never taken
    assert bridge.take_abandoned() == ["s/c0"] and bridge.take() == [] and bridge.take_abandoned() == []
    assert not bridge.resolve(TurnOutcome(_result("s/c0"), "serving")) and taken.future.cancelled()
