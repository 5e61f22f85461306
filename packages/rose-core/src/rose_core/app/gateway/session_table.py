"""Every gateway session of the job, by id, and the groups they belong to.

A session is opened into a group, makes calls (one at a time: each is one turn of its trajectory), and is
closed by its reward. A group is complete when ``group_size`` of its sessions are closed; the RL job takes
complete groups, oldest first, ``prompts_per_step`` at a time, and trains on their trajectories. Taken
sessions are gone: a call to one gets a 404.

Thread-safe: HTTP handler threads open, call and close sessions while the controller thread takes groups;
every method holds the table's lock, and nothing slow (tokenising aside) runs under it.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rose_core.app.gateway.openai_api import GatewayError
from rose_core.app.gateway.session_history import SessionHistory
from rose_core.app.rl.algorithm.trajectory import Trajectory, Turn


@dataclass(slots=True)
class Session:
    session_id: str
    group: str
    trajectory: Trajectory
    metadata: dict[str, Any]
    history: SessionHistory = field(default_factory=SessionHistory)
    calls: int = 0
    busy: bool = False
    closed: bool = False


@dataclass(slots=True)
class _Group:
    serial: int
    sessions: list[str] = field(default_factory=list)
    closed: int = 0


class SessionTable:
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self._sessions: dict[str, Session] = {}
        self._groups: dict[str, _Group] = {}
        self._complete: list[str] = []
        self._serial = 0
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- HTTP threads

    def open(self, group: str, metadata: dict[str, Any]) -> Session:
        if not group or len(group) > 200:
            raise GatewayError(400, "group must be a non-empty id of at most 200 characters", "group")
        with self._lock:
            entry = self._groups.get(group)
            if entry is None:
                self._serial += 1
                entry = self._groups[group] = _Group(self._serial)
            if len(entry.sessions) >= self.group_size:
                raise GatewayError(409, f"group {group!r} already has its {self.group_size} sessions (rl.group_size): "
                                        "start another group", "group", "conflict_error")
            session_id = secrets.token_hex(8)
            trajectory = Trajectory(trajectory_id=session_id, group_id=f"{group}#{entry.serial}", env_seed=0)
            session = self._sessions[session_id] = Session(session_id, group, trajectory, dict(metadata))
            entry.sessions.append(session_id)
            return session

    def begin_call(self, session_id: str, prompt: Callable[[SessionHistory], list[int]]) -> list[int]:
        """Mark the session busy and build the call's prompt from its history (``prompt`` runs under the lock:
        it only tokenises what is new)."""
        with self._lock:
            session = self._open_session(session_id)
            if session.busy:
                raise GatewayError(409, f"session {session_id} has a call in flight: one call at a time per session "
                                        "(each is one turn; open one session per parallel sample)",
                                   kind="conflict_error")
            tokens = prompt(session.history)
            session.busy = True
            return tokens

    def finish_call(self, session_id: str, turn: Turn, key: str | None) -> None:
        with self._lock:
            session = self._sessions[session_id]
            session.history.add_reply(turn.response_token_ids, key)
            session.trajectory.add_turn(turn)
            session.calls += 1
            session.busy = False

    def fail_call(self, session_id: str) -> None:
        """The call in flight did not finish (timeout, job stopping): its prompt tokens are taken back."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.busy:
                session.history.drop_pending()
                session.busy = False

    def close(self, session_id: str, reward: float, success: bool | None) -> Session:
        with self._lock:
            session = self._open_session(session_id)
            if session.busy:
                raise GatewayError(409, f"session {session_id} has a call in flight: send the reward after its reply",
                                   kind="conflict_error")
            if not session.calls:
                raise GatewayError(400, f"session {session_id} made no call: there is nothing to reward",
                                   "reward")
            session.trajectory.total_reward = float(reward)
            session.trajectory.finish(success=reward > 0 if success is None else success)
            session.closed = True
            group = self._groups[session.group]
            group.closed += 1
            if group.closed == self.group_size:
                self._complete.append(session.group)
            return session

    def get(self, session_id: str) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise _unknown(session_id)
            return session

    # ---------------------------------------------------------------- the controller thread

    def take_groups(self, count: int) -> list[list[Trajectory]]:
        """Up to ``count`` complete groups, oldest first; their sessions leave the table."""
        with self._lock:
            taken, self._complete = self._complete[:count], self._complete[count:]
            out = []
            for name in taken:
                group = self._groups.pop(name)
                out.append([self._sessions.pop(sid).trajectory for sid in group.sessions])
            return out

    def counts(self) -> tuple[int, int]:
        """(open sessions, complete groups waiting)."""
        with self._lock:
            return sum(not s.closed for s in self._sessions.values()), len(self._complete)

    def _open_session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise _unknown(session_id)
        if session.closed:
            raise GatewayError(409, f"session {session_id} is closed (its reward was sent): open a new session",
                               kind="conflict_error")
        return session


def _unknown(session_id: str) -> GatewayError:
    return GatewayError(404, f"unknown session {session_id!r}: open one with POST /sessions (a session is gone once "
                             "its group was trained on)", kind="not_found_error")
