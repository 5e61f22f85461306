"""Every gateway session of the job, by id, and the groups they belong to.

A session is opened into a group, makes calls (one at a time: each is one turn of its trajectory), and is
closed by its reward. A group is complete when ``group_size`` of its sessions are closed; the RL job takes
complete groups, oldest first, ``prompts_per_step`` at a time, and trains on their trajectories. Taken
sessions are gone: a call to one gets a 404.

Thread-safe: HTTP handler threads open, call and close sessions while the controller thread takes groups;
every method holds the table's lock, and nothing slow runs under it (a call's prompt is tokenised outside it,
while the session is marked busy: no other thread touches that history then).

Complete groups are written to a ``GroupJournal`` (when the job checkpoints) until a checkpoint covers the step
that trained them; a resumed job ``restore``s them. Sessions still open when the controller stops are not kept:
their next call gets a 404 that says to open a new session and play the episode again.

Bounded (``SessionLimits``): open sessions, a session's metadata and its calls are capped (429 / 413 past
them), and a group none of whose sessions was used for ``idle_s`` is dropped whole (its sessions answer 404
after), so agents that vanish cannot fill the controller's memory.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rose_core.app.gateway.group_journal import GroupJournal, JournaledGroup
from rose_core.app.gateway.openai_api import GatewayError
from rose_core.app.gateway.session_history import SessionHistory
from rose_core.app.rl.algorithm.trajectory import Trajectory, Turn

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_sessions: int = 10_000
    """Sessions held at once (open, or closed in a group not yet trained on)."""
    max_metadata_bytes: int = 16 << 10
    """A session's metadata, as JSON."""
    max_calls: int = 1_000
    """Calls (turns) per session."""
    idle_s: float = 3_600.0
    """A group none of whose sessions was opened, called or closed for this long is dropped."""


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
    used: float = 0.0
    """The clock's time of the session's last open, call or close."""


@dataclass(slots=True)
class _Group:
    serial: int
    sessions: list[str] = field(default_factory=list)
    closed: int = 0


class SessionTable:
    def __init__(self, group_size: int, limits: SessionLimits | None = None,
                 clock: Callable[[], float] = time.monotonic, journal: GroupJournal | None = None,
                 first_serial: int = 0) -> None:
        self.group_size = group_size
        self.limits = limits or SessionLimits()
        self.journal = journal
        """Where complete groups are written until a checkpoint covers them (``group_journal``); None: nowhere."""
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._groups: dict[str, _Group] = {}
        self._complete: list[str] = []
        self._serial = first_serial
        """The last group serial used (a restarted job starts past the journaled ones: their files stay theirs)."""
        self._swept = 0.0
        self.expired_groups = 0
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- HTTP threads

    def open(self, group: str, metadata: dict[str, Any]) -> Session:
        if not group or len(group) > 200:
            raise GatewayError(400, "group must be a non-empty id of at most 200 characters", "group")
        size = len(json.dumps(metadata))
        if size > self.limits.max_metadata_bytes:
            raise GatewayError(413, f"the session's metadata is {size} bytes of JSON, over "
                                    f"{self.limits.max_metadata_bytes} (gateway.max_metadata_bytes)", "metadata")
        with self._lock:
            now = self._clock()
            self._expire(now)
            if len(self._sessions) >= self.limits.max_sessions:
                raise GatewayError(429, f"{len(self._sessions)} sessions are held, the most the gateway keeps "
                                        "(gateway.max_sessions): send the rewards of open ones, or retry later",
                                   kind="rate_limit_error")
            entry = self._groups.get(group)
            if entry is None:
                self._serial += 1
                entry = self._groups[group] = _Group(self._serial)
            if len(entry.sessions) >= self.group_size:
                raise GatewayError(409, f"group {group!r} already has its {self.group_size} sessions (rl.group_size): "
                                        "start another group", "group", "conflict_error")
            session_id = secrets.token_hex(8)
            trajectory = Trajectory(trajectory_id=session_id, group_id=f"{group}#{entry.serial}", env_seed=0)
            session = self._sessions[session_id] = Session(session_id, group, trajectory, dict(metadata), used=now)
            entry.sessions.append(session_id)
            return session

    def begin_call(self, session_id: str, prompt: Callable[[SessionHistory], list[int]]) -> list[int]:
        """Mark the session busy, then build the call's prompt from its history outside the lock (``prompt``
        tokenises what is new; the busy session's history is this thread's alone). A ``prompt`` that fails
        leaves the session as it was."""
        with self._lock:
            session = self._open_session(session_id)
            if session.busy:
                raise GatewayError(409, f"session {session_id} has a call in flight: one call at a time per session "
                                        "(each is one turn; open one session per parallel sample)",
                                   kind="conflict_error")
            if session.calls >= self.limits.max_calls:
                raise GatewayError(429, f"session {session_id} made {session.calls} calls, the most a session may "
                                        "(gateway.max_calls_per_session): send its reward and open another",
                                   kind="rate_limit_error")
            session.busy = True
            session.used = self._clock()
        try:
            return prompt(session.history)
        except BaseException:
            with self._lock:
                session.busy = False
            raise

    def finish_call(self, session_id: str, turn: Turn, key: str | None) -> None:
        with self._lock:
            session = self._sessions[session_id]
            session.history.add_reply(turn.response_token_ids, key)
            session.trajectory.add_turn(turn)
            session.calls += 1
            session.busy = False
            session.used = self._clock()

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
            session.used = self._clock()
            group = self._groups[session.group]
            group.closed += 1
            complete = group.closed == self.group_size
            if complete:
                self._complete.append(session.group)
                done = JournaledGroup(group.serial, session.group,
                                      [self._sessions[sid].trajectory for sid in group.sessions])
        if complete and self.journal is not None:
            try:
                self.journal.save(done)  # outside the lock: a file write
            except OSError as exc:
                log.warning("gateway: could not journal group %s (%s): a restart before the next checkpoint "
                            "loses it", session.group, exc)
        return session

    def restore(self, groups: list[JournaledGroup]) -> None:
        """Put journaled groups back as complete (a resumed job trains them again), oldest first. They are held
        under ``<name>#<serial>``: an agent that already opened a new group of the same name keeps it."""
        keys = []
        with self._lock:
            for journaled in groups:
                key = f"{journaled.name}#{journaled.serial}"
                entry = self._groups[key] = _Group(journaled.serial, closed=len(journaled.trajectories))
                for trajectory in journaled.trajectories:
                    self._sessions[trajectory.trajectory_id] = Session(
                        trajectory.trajectory_id, key, trajectory, {}, calls=len(trajectory.turns),
                        closed=True, used=self._clock())
                    entry.sessions.append(trajectory.trajectory_id)
                keys.append(key)
                self._serial = max(self._serial, journaled.serial)
            self._complete[:0] = keys  # before any group completed since the restart: they are older

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

    def _expire(self, now: float) -> None:
        """Drop the incomplete groups idle for ``limits.idle_s`` (at most one sweep a second; under the lock)."""
        if now - self._swept < min(1.0, self.limits.idle_s):
            return
        self._swept = now
        complete = set(self._complete)
        stale = [name for name, group in self._groups.items() if name not in complete and all(
            not self._sessions[sid].busy and now - self._sessions[sid].used > self.limits.idle_s
            for sid in group.sessions)]
        for name in stale:
            for sid in self._groups.pop(name).sessions:
                del self._sessions[sid]
        if stale:
            self.expired_groups += len(stale)
            log.warning("gateway: dropped %d group(s) idle for over %.0f s (gateway.session_idle_s)", len(stale),
                        self.limits.idle_s)

    def _open_session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise _unknown(session_id)
        if session.closed:
            raise GatewayError(409, f"session {session_id} is closed (its reward was sent): open a new session",
                               kind="conflict_error")
        return session


def serial_of(trajectory: Trajectory) -> int:
    """The serial of the group a session's trajectory belongs to (its ``group_id`` is ``<group>#<serial>``)."""
    return int(trajectory.group_id.rsplit("#", 1)[1])


def _unknown(session_id: str) -> GatewayError:
    return GatewayError(404, f"unknown session {session_id!r}: open one with POST /sessions (a session is gone once "
                             "its group was trained on, dropped idle (gateway.session_idle_s), or in flight when the "
                             "controller restarted: open a new session and play the episode again)",
                        kind="not_found_error")
