"""The executor's session with its controller: the handshake (Hello -> Welcome), the heartbeats with the host's
load, the dispatch of what the controller sends to the host's parts, and joining a controller again.

A controller that restarted (or lost this executor) answers the next message with ``no_handshake`` or
``not_registered`` (signed): the session says Hello again and registers on the Welcome, and the turns the old
controller sent are given back (``controller_restarted``); the engines and production serving never stop.
An unsigned notice (anyone can send one) is shown, never acted on. While the controller is down, what the
session sends is queued or dropped by the channel (``rose_core.transport``), never waited on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import assert_never

from rose_core.protocol.messages import (
    CancelTurn,
    ErrorReport,
    FromController,
    Heartbeat,
    Hello,
    Release,
    Shutdown,
    StatusSnapshot,
    StepStarted,
    TurnRequest,
    WeightAnnounce,
    Welcome,
)
from rose_core.protocol.wire import is_unsigned_notice
from rose_core.support.errors import RoseError
from rose_executor import __version__
from rose_executor.agent.controller_link import ControllerLink
from rose_executor.agent.host import Host
from rose_executor.agent.load_report import load_report

log = logging.getLogger(__name__)
REJOIN_CODES = ("no_handshake", "not_registered")
"""What a controller that does not know this executor answers (signed): join it again."""


class NoWelcome(RoseError):
    """No controller welcomed this executor within ``welcome_timeout_s`` (``notice``: an unsigned one answered)."""

    def __init__(self, message: str, notice: ErrorReport | None) -> None:
        super().__init__(message)
        self.notice = notice


class Refused(RoseError):
    """The controller answered the Hello with a signed refusal (``code``: ``released`` from a job that is done
    with this executor, ``wrong_version``...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"the controller refused this executor ({code}): {message}")
        self.code = code


class ControllerSession:
    """``state()``: the executor's state for its heartbeats; ``stop(reason, exit_code)``: what the controller's
    ``Shutdown`` (or its refusal of the registration) asks of the agent; ``release(reason)``: what its
    ``Release`` asks (the end of the lease)."""

    def __init__(self, link: ControllerLink, executor_id: str, controller: str, welcome_timeout_s: float,
                 state: Callable[[], str], stop: Callable[[str, int], None],
                 release: Callable[[str], None]) -> None:
        self.link = link
        self.executor_id = executor_id
        self.controller = controller
        self.welcome_timeout_s = welcome_timeout_s
        self.state = state
        self.stop = stop
        self.release = release
        self.host: Host | None = None
        """Set once the host is built: what turns, cancellations, versions and steps go to."""
        self.welcome: Welcome | None = None
        self.rejoins = 0
        self._heartbeat_seq = 0
        self._rejoining: float | None = None  # when this executor sent Hello to a controller that lost it
        self.rejoin_aborts: list[asyncio.Future[None]] = []

    @property
    def heartbeat_s(self) -> float:
        return self.welcome.heartbeat_interval_s if self.welcome else 1.0

    @property
    def controller_id(self) -> str:
        return self.welcome.controller_id if self.welcome else ""

    def hello(self) -> Hello:
        return Hello(peer_id=self.executor_id, kind="executor", software=f"rose-executor {__version__}")

    async def handshake(self, encrypted: bool) -> Welcome:
        self.link.send(self.hello())
        deadline = time.monotonic() + self.welcome_timeout_s
        notice: ErrorReport | None = None
        while (left := deadline - time.monotonic()) > 0:
            msg = await self.link.recv(timeout=left)
            if isinstance(msg, Welcome):
                self.welcome = msg
                return msg
            if is_unsigned_notice(msg):
                notice = msg  # anyone can send one: shown (and in the error at the timeout), never acted on
                log.warning("unsigned notice (cannot be verified) from %s: %s: %s", self.controller, msg.code,
                            msg.message)
            elif isinstance(msg, ErrorReport):
                raise Refused(msg.code, msg.message)
        waited = f"no Welcome from the controller at {self.controller} within {self.welcome_timeout_s:g} s"
        if notice is not None:
            raise NoWelcome(f"{waited}; it answered with an unsigned notice ({notice.code}): {notice.message}", notice)
        hint = "" if encrypted else " (and, if it encrypts, set encrypt_control = true)"
        raise NoWelcome(f"{waited}: check --controller and that the controller is running{hint}", None)

    def register(self) -> None:
        if self.host is not None:
            self.link.send(self.host.register_message())

    # ---------------------------------------------------------------- steady state

    async def heartbeats(self, alive: Callable[[], bool]) -> None:
        """Heartbeat every interval while ``alive()`` (it stops the agent itself when it is not)."""
        while alive():
            if self._rejoining is not None and time.monotonic() - self._rejoining > self.welcome_timeout_s:
                self._rejoining = None  # no Welcome: the next message's no_handshake starts another attempt
            self.send_heartbeat()
            await asyncio.sleep(self.heartbeat_s)

    def send_heartbeat(self) -> None:
        if self.host is None:
            return
        seq, self._heartbeat_seq = self._heartbeat_seq, self._heartbeat_seq + 1
        self.link.send(Heartbeat(executor_id=self.executor_id, seq=seq, sent_at=time.time(),
                                 load=load_report(self.host, self.state())))

    async def dispatch(self) -> None:
        while True:
            msg = await self.link.recv()
            if msg is not None:
                self.handle(msg)

    def handle(self, msg: FromController) -> None:
        host = self.host
        if host is None or host.runner is None or host.updater is None:
            return
        match msg:
            case TurnRequest():
                host.runner.submit(msg)
            case CancelTurn():
                host.runner.cancel(msg.turn_id, msg.attempt)
            case WeightAnnounce():
                host.updater.announce(msg)
            case StepStarted():
                if host.co_serving is not None:
                    host.co_serving.on_step(msg.step)
            case Shutdown():
                self.stop(f"the controller asked ({msg.reason or 'no reason given'})", 0)
            case Release():
                self.release(f"the job released it ({msg.reason or 'no reason given'})")
            case ErrorReport():
                self._on_error_report(msg)
            case Welcome():
                self._on_welcome(msg)
            case StatusSnapshot():
                pass
            case _:
                assert_never(msg)

    # ---------------------------------------------------------------- joining again

    def _on_error_report(self, msg: ErrorReport) -> None:
        log.warning("controller reports %s%s: %s", msg.code, " (unsigned)" if is_unsigned_notice(msg) else "",
                    msg.message)
        if is_unsigned_notice(msg):  # shown, never acted on
            return
        if msg.code in REJOIN_CODES:
            self._rejoin(msg.code)
        elif msg.code == "bad_registration":
            self.stop(f"the controller refused this executor's registration: {msg.message}", 2)

    def _rejoin(self, why: str) -> None:
        """The controller does not know this executor (it restarted): say Hello again; Register on its Welcome."""
        if self._rejoining is not None or self.state() == "stopping":
            return
        self._rejoining = time.monotonic()
        log.warning("the controller answered %s: it restarted or lost this executor; joining it again "
                    "(engines and serving go on)", why)
        self.link.send(self.hello())
        if self.host is not None and self.host.runner is not None:  # the new controller re-runs what it needs
            self.rejoin_aborts = self.host.runner.abort_now("controller_restarted")

    def _on_welcome(self, msg: Welcome) -> None:
        if self._rejoining is None:
            return
        self._rejoining = None
        self.welcome = msg
        self.register()
        self.rejoins += 1
        log.info("executor %s registered again with %s", self.executor_id, msg.controller_id)
