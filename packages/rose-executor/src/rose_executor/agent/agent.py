"""The per-host executor agent: one asyncio program that owns this host's engines and talks to the controller.

Flow: Hello -> Welcome (``ControllerSession``), start the host (``build_host``: the engines and, on a serving
host, the OpenAI endpoint), Register, then heartbeat while handling turns, cancellations, weight
announcements and steps, until ``Shutdown`` or SIGINT/SIGTERM: give in-flight turns back, say Goodbye, stop
the host.

One RL job per serving host: a serving executor holds the lending lease of its endpoint
(``host.lending_lease``); one started for the same endpoint by another job tells its controller who holds it
(``ErrorReport`` ``already_lent``) and stops.

Revocation (serving role): SIGUSR1 (``rose-executor revoke``), or serving without SLO headroom for
``revoke_after_pressure_s``, takes the host back from the RL job: a heartbeat saying ``revoked`` goes out at
once (the controller re-routes this host's turns and borrows no more of it), then every in-flight turn is
given back (``revoked``); serving goes on, and every later turn is refused until the executor restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

from rose_core.config.executor_config import ExecutorConfig
from rose_core.protocol.auth import ExecutorCredential
from rose_core.protocol.messages import Goodbye, Role
from rose_core.support.heap import freeze_startup_heap
from rose_core.transport.loop_control_client import LoopControlClient
from rose_executor.agent.controller_link import ClientFactory, ControllerLink
from rose_executor.agent.host import Host, HostPlan, build_host
from rose_executor.agent.session import ControllerSession
from rose_executor.engine.engine_launcher import EngineLauncher, VllmLauncher
from rose_executor.host.device import resolve_device

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """What the command line says about this executor (the config file says the rest)."""

    controller: str
    role: Role
    executor_id: str
    credential: ExecutorCredential
    """Its own control key, the weights key and the observer key (``rose_core.protocol.auth.executor_credential``)."""
    metrics_endpoint: str = ""
    parent_pid: int | None = None
    """The launcher (`rose run`): when it is gone (this process was re-parented), the executor stops; a
    controller killed with SIGKILL must not leave its executors running (nothing would ever stop them)."""
    freeze_heap: bool = True
    """Freeze the startup heap out of full GC passes once the engines run (``rose_core.support.heap``): this
    process is an executor's. An agent run inside another program (a test's) leaves that program's heap alone."""


class ExecutorAgent:
    """Runs until told to stop; ``run`` returns the process exit code, or raises ``RoseError`` at start-up."""

    def __init__(self, config: ExecutorConfig, options: AgentOptions, launcher: EngineLauncher | None = None,
                 connect: ClientFactory = LoopControlClient) -> None:
        """``launcher`` starts the engines and ``connect`` the control channel: vLLM and ZMQ by default,
        ``FakeEngineLauncher`` and ``InProcessClient`` (the in-process twins) in tests."""
        config.check_role(options.role)
        self.device = resolve_device(config.device, config.tensor_parallel_size)
        self.config = config
        self.options = options
        self._launcher = launcher or VllmLauncher()
        self._connect = connect
        self.exit_code = 0
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._session: ControllerSession | None = None
        self._host: Host | None = None
        self._revoking: asyncio.Task[int] | None = None

    @property
    def executor_id(self) -> str:
        return self.options.executor_id

    @property
    def rejoins(self) -> int:
        return self._session.rejoins if self._session else 0

    def request_stop(self, reason: str, exit_code: int = 0) -> None:
        if not self._stop.is_set():
            log.info("stopping: %s", reason)
            self._stop_reason = reason
            self.exit_code = exit_code
            self._stop.set()

    # ---------------------------------------------------------------- the whole life

    async def run(self) -> int:
        self._install_signal_handlers()
        welcomed = False
        try:
            session = self._session = ControllerSession(
                self._link(), self.executor_id, self.options.controller, self.config.welcome_timeout_s,
                self._state, self.request_stop)
            welcome = await session.handshake(encrypted=self.config.encrypt_control)
            welcomed = True
            self._host = Host(self._plan(welcome.controller_id), self._launcher)
            await build_host(self._host, session.link.send, self._revoke_on_pressure)
            session.host = self._host
            if not self._stop.is_set():
                if self.options.freeze_heap:
                    freeze_startup_heap()
                session.register()
                log.info("executor %s registered with %s as %s", self.executor_id, welcome.controller_id,
                         self.options.role)
                await self._serve(session)
        finally:
            await self._shutdown(welcomed)
        return self.exit_code

    def _link(self) -> ControllerLink:
        connect = self._connect
        if self.config.encrypt_control and connect is LoopControlClient:
            connect = partial(LoopControlClient, encrypt_with=self.options.credential.observer)
        return ControllerLink(self.options.controller, self.options.credential.control, self.executor_id, connect)

    def _plan(self, controller_id: str) -> HostPlan:
        return HostPlan(self.config, self.options.role, self.executor_id, self.device, self.options.controller,
                        self.options.credential.weights, self.options.metrics_endpoint, controller_id)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop, f"received {signal.Signals(sig).name}")
        loop.add_signal_handler(signal.SIGUSR1, self.revoke, "the serving owner sent SIGUSR1 (rose-executor revoke)")

    def revoke(self, why: str) -> None:
        """Take this serving host back from the RL job (see the module docstring); idempotent."""
        runner = self._host.runner if self._host else None
        if self.options.role != "serving":
            log.warning("ignored a revocation (%s): a dedicated executor is not lent, stop it instead", why)
            return
        if runner is None or runner.revoked or self._session is None:
            return
        runner.revoked = True
        log.warning("revoked: %s; giving every rollout turn back, serving goes on", why)
        self._session.send_heartbeat()  # the controller re-routes before the turns come back one by one
        self._revoking = asyncio.get_running_loop().create_task(runner.revoke())

    def _revoke_on_pressure(self, seconds: float) -> None:
        self.revoke(f"serving had no SLO headroom for {seconds:.0f} s (revoke_after_pressure_s)")

    # ---------------------------------------------------------------- steady state

    async def _serve(self, session: ControllerSession) -> None:
        loops: list[Coroutine[Any, Any, None]] = [session.heartbeats(self._alive), session.dispatch()]
        if self._host is not None and self._host.co_serving is not None:
            loops.append(self._host.co_serving.run())
        tasks = [asyncio.create_task(coro) for coro in loops]
        stop = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                failure = None if task is stop else task.exception()
                if failure is not None:
                    raise failure
        finally:
            for task in [stop, *tasks]:
                task.cancel()
            await asyncio.gather(stop, *tasks, return_exceptions=True)

    def _alive(self) -> bool:
        """Whether to go on heartbeating: no engine died and the launcher is still there (else stop)."""
        if self._host is not None and any(engine.errored for engine in self._host.engines):
            self.request_stop("a vLLM engine died; see the log above", exit_code=1)
            return False
        parent = self.options.parent_pid
        if parent is not None and os.getppid() != parent:
            self.request_stop(f"its launcher (pid {parent}) is gone", exit_code=1)
            return False
        return True

    def _state(self) -> str:
        host = self._host
        runner = host.runner if host else None
        if self._stop.is_set():
            return "stopping"
        if runner is not None and runner.revoked:
            return "revoked"
        if host is not None and host.updater is not None and host.updater.updating:
            return "updating"
        if runner is not None and runner.held:
            return "held"
        return "ready"

    # ---------------------------------------------------------------- the end

    async def _shutdown(self, welcomed: bool) -> None:
        reason = self._stop_reason or "stopped"
        session, host = self._session, self._host
        if self._revoking is not None:
            await asyncio.gather(self._revoking, return_exceptions=True)
        if session is not None:
            await asyncio.gather(*session.rejoin_aborts, return_exceptions=True)
        if host is not None and host.runner is not None:
            host.runner.refuse("shutdown")
            aborted = await host.runner.abort_all("shutdown")
            log.info("gave back %d in-flight turns", aborted)
        if host is not None and host.updater is not None:
            await host.updater.close()
        if session is not None and welcomed:
            session.link.send(Goodbye(peer_id=self.executor_id, reason=reason))
        if host is not None:
            await host.stop()
        else:
            await asyncio.to_thread(self._launcher.close)
        if session is not None:
            await session.link.close()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                loop.remove_signal_handler(sig)
