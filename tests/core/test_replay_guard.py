"""The replay guard alone (time passed in): every genuine message once, no replay ever, bounded memory."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_core.protocol.replay_guard import ReplayGuard
from rose_core.protocol.wire import Stamp
from rose_core.support.errors import ProtocolError

WINDOW = 120.0


def session(n: int) -> bytes:
    return n.to_bytes(16, "big")


def test_a_session_is_accepted_in_order_and_each_message_once() -> None:
    guard = ReplayGuard(WINDOW)
    guard.check(b"e", Stamp(session(1), 1, 1000.0), 1000.0)
    guard.check(b"e", Stamp(session(1), 3, 1001.0), 1001.0)  # 2 lost on the way: later ones still pass
    for seq in (3, 2, 1):
        with pytest.raises(ProtocolError, match="accepted before") as exc:
            guard.check(b"e", Stamp(session(1), seq, 1001.0), 1002.0)
        assert exc.value.reason == "replay"


def test_a_session_belongs_to_the_connection_it_started_on() -> None:
    guard = ReplayGuard(WINDOW)
    guard.check(b"e", Stamp(session(1), 1, 1000.0), 1000.0)
    with pytest.raises(ProtocolError, match="another connection's session"):
        guard.check(b"x", Stamp(session(1), 2, 1000.0), 1000.5)


def test_a_restarted_sender_replaces_its_session_and_the_old_one_is_never_accepted_again() -> None:
    guard = ReplayGuard(WINDOW)
    guard.check(b"e", Stamp(session(1), 5, 1000.0), 1000.0)
    guard.check(b"e", Stamp(session(2), 1, 1010.0), 1010.0)
    with pytest.raises(ProtocolError, match="session its sender has left"):
        guard.check(b"e", Stamp(session(1), 6, 1009.0), 1011.0)


@pytest.mark.parametrize("sent_at", [1000.0 - WINDOW - 1, 1000.0 + WINDOW + 1])
def test_a_new_session_must_be_sealed_within_the_window(sent_at: float) -> None:
    with pytest.raises(ProtocolError, match="run NTP on both") as exc:
        ReplayGuard(WINDOW).check(b"e", Stamp(session(1), 1, sent_at), 1000.0)
    assert exc.value.reason == "replay"


def test_sessions_silent_for_two_windows_are_forgotten_and_their_messages_stay_rejected() -> None:
    guard = ReplayGuard(WINDOW)
    for n in range(100):
        guard.check(f"p{n}".encode(), Stamp(session(n), 1, 1000.0), 1000.0)
    guard.check(b"late", Stamp(session(1000), 1, 1000.0 + 3 * WINDOW), 1000.0 + 3 * WINDOW)
    assert guard.sessions == 1
    with pytest.raises(ProtocolError, match="sealed"):  # forgotten, but too old to start a session
        guard.check(b"p1", Stamp(session(1), 2, 1000.0), 1000.0 + 3 * WINDOW)


def test_the_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ReplayGuard(0)


# A run: senders (peer, sender instance) seal messages in order; the attacker records every message it sees and
# plays any of them again, on any peer's connection; senders restart (a new session) now and then.
step = st.one_of(
    st.tuples(st.just("send"), st.integers(0, 2)),
    st.tuples(st.just("restart"), st.integers(0, 2)),
    st.tuples(st.just("replay"), st.integers(0, 10_000), st.integers(0, 2)),
    st.tuples(st.just("wait"), st.floats(0, 100)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=80))
def test_genuine_messages_pass_once_in_order_and_no_replay_ever_does(steps: list[tuple]) -> None:
    guard, now = ReplayGuard(WINDOW), 1000.0
    sessions = {peer: [session(peer * 1000), 0] for peer in range(3)}
    recorded: list[tuple[bytes, Stamp]] = []
    for action, *args in steps:
        if action == "wait":
            now += args[0]
        elif action == "restart":
            current = sessions[args[0]][0]
            sessions[args[0]] = [session(int.from_bytes(current, "big") + 1), 0]
        elif action == "send":
            peer = args[0]
            sessions[peer][1] += 1
            stamp = Stamp(sessions[peer][0], sessions[peer][1], now)
            guard.check(bytes([peer]), stamp, now)  # a genuine message is always accepted
            recorded.append((bytes([peer]), stamp))
        elif recorded:
            _, stamp = recorded[args[0] % len(recorded)]
            with pytest.raises(ProtocolError):
                guard.check(bytes([args[1]]), stamp, now)
