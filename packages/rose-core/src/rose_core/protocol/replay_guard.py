"""``ReplayGuard``: which authenticated messages are fresh, per peer connection.

Every sealed message carries its sender's stamp inside the MAC (``rose_core.protocol.wire``): a session (16 random
bytes per sealing ``Framer``), a sequence number (+1 per message that framer seals) and the time it was sealed.

Invariant: a message from ``peer`` is accepted only if

- its session is ``peer``'s current one and its number is above the last one accepted from it; or
- its session was never seen (from any peer) and it was sealed within ``window_s`` of now (either way: a clock
  ahead is no better than one behind). It becomes ``peer``'s current session (a sender that restarted, or a
  peer seen for the first time); the session it replaces is never accepted again.

So a captured message played again is rejected, whatever the attacker does with it: on the same connection
(its number is not above the last), on another connection (its session belongs to another peer), after its
sender moved on (its session was replaced), or later than ``window_s`` (too old to start a session). What is
left: a message captured but never delivered is accepted once if it arrives fresh, as it would have been.

Memory: one entry per session heard from in the last ``2 * window_s`` (an older one is forgotten: any message
of it was sealed before its last accepted one, so it is too old to pass the time check, given clocks within
``window_s`` of each other). Only authenticated messages reach the guard, so only holders of the secret add
entries. Pure: time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from rose_core.protocol.wire import Stamp
from rose_core.support.errors import ProtocolError

DEFAULT_WINDOW_S = 120.0
"""How far a new session's first message may be from now: the hosts' clocks must agree to within this (NTP)."""


@dataclass(slots=True)
class _Session:
    peer: bytes
    last_seq: int
    heard_at: float
    current: bool = True


class ReplayGuard:
    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        if window_s <= 0:
            raise ValueError("the replay window must be positive")
        self.window_s = window_s
        self._sessions: dict[bytes, _Session] = {}
        self._current: dict[bytes, bytes] = {}
        """peer -> its current session."""
        self._pruned_at = 0.0

    def check(self, peer: bytes, stamp: Stamp, now: float) -> None:
        """Accept (and remember) ``stamp`` from ``peer``, or raise ``ProtocolError("replay")`` naming why."""
        session = self._sessions.get(stamp.session)
        if session is None:
            self._start(peer, stamp, now)
            return
        if session.peer != peer:
            raise ProtocolError("replay", "a message of another connection's session: played again, dropped")
        if not session.current:
            raise ProtocolError("replay", "a message of a session its sender has left: played again, dropped")
        if stamp.seq <= session.last_seq:
            raise ProtocolError(
                "replay", f"message number {stamp.seq} of this session was accepted before (last {session.last_seq})")
        session.last_seq, session.heard_at = stamp.seq, now

    def _start(self, peer: bytes, stamp: Stamp, now: float) -> None:
        age = now - stamp.sent_at
        if abs(age) > self.window_s:
            raise ProtocolError(
                "replay",
                f"a new session's first message sealed {age:+.0f} s from now (limit {self.window_s:.0f} s): played "
                "again, or this host's clock and the sender's differ (run NTP on both)",
            )
        self._prune(now)
        if (old := self._current.get(peer)) is not None and old in self._sessions:
            self._sessions[old].current = False
        self._sessions[stamp.session] = _Session(peer, stamp.seq, now)
        self._current[peer] = stamp.session

    def _prune(self, now: float) -> None:
        if now - self._pruned_at < self.window_s:
            return
        self._pruned_at = now
        horizon = now - 2 * self.window_s
        for key in [k for k, s in self._sessions.items() if s.heard_at < horizon]:
            session = self._sessions.pop(key)
            if self._current.get(session.peer) == key:
                del self._current[session.peer]

    @property
    def sessions(self) -> int:
        """Sessions remembered now (for tests and metrics)."""
        return len(self._sessions)
