"""The per-host executor agent: one asyncio program that owns this host's engines and talks to the controller.

A serving host is a standing service: it starts production first (its serving engine behind vLLM's OpenAI
app, ``start_production``) and serves with no RL job at all. Then it lends itself to one job at a time: it
says Hello to its controller address until a job's controller welcomes it, starts the job's rollout engine
(``start_lending``, on the policy the ``Welcome`` names), registers, and heartbeats while handling turns,
cancellations, weight announcements and steps, until the lease ends: the job releases it (``Release``: the
job ended, or took it out after a failed weight apply), or its rollout engine dies. Then it gives the turns
back, says Goodbye, stops the rollout engine (``stop_lending``) and goes on serving, ready for the next job.
Only its operator stops it (SIGINT/SIGTERM, or ``Shutdown`` from `rose run`, which started it). A dedicated
executor serves one job: it stops when released.

One RL job per serving host: one process holds the lease of its serving endpoint (``host.lending_lease``);
another started for the same endpoint is refused with the holder's name.

Revocation (serving role): SIGUSR1 (``rose-executor revoke``), or serving without SLO headroom for
``revoke_after_pressure_s``, takes the host back from the RL job: a heartbeat saying ``revoked`` goes out at
once (the controller re-routes this host's turns and borrows no more of it), then every in-flight turn is
given back (``revoked``) and the lease ends (Goodbye ``revoked: ...``, the rollout engine stopped). Serving
goes on; that job does not welcome the host again, the next job does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rose_core.config.executor_config import ExecutorConfig
from rose_core.protocol.auth import ExecutorCredential
from rose_core.protocol.messages import Goodbye, Role, Welcome
from rose_core.support.heap import freeze_startup_heap
from rose_core.transport.loop_control_client import LoopControlClient
from rose_executor.agent.controller_link import ClientFactory, ControllerLink
from rose_executor.agent.host import (
    Host,
    HostPlan,
    give_turns_back,
    start_lending,
    start_production,
    stop_lending,
)
from rose_executor.agent.load_report import host_state
from rose_executor.agent.session import ControllerSession, NoWelcome, Refused
from rose_executor.engine.engine_launcher import EngineLauncher, VllmLauncher
from rose_executor.host.device import resolve_device
from rose_executor.rollout.rollout_runner import RolloutRunner

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
        self._lease_over = asyncio.Event()
        self._lease_reason, self._lease_fault = "", False
        self._session: ControllerSession | None = None
        """The current lease's (``None`` between leases)."""
        self._host: Host | None = None
        self._revoking: asyncio.Task[None] | None = None
        self.lent_to = ""
        """The controller id of the job holding the lease ("" while lent to none)."""
        self.leases = 0  # leases that ended (jobs this host served and was released by)
        self.rejoins_before = 0
        self._failed_starts = 0  # leases in a row whose rollout side would not start: each next Hello waits longer

    @property
    def executor_id(self) -> str:
        return self.options.executor_id

    @property
    def rejoins(self) -> int:
        return self.rejoins_before + (self._session.rejoins if self._session else 0)

    def request_stop(self, reason: str, exit_code: int = 0) -> None:
        if not self._stop.is_set():
            log.info("stopping: %s", reason)
            self._stop_reason = reason
            self.exit_code = exit_code
            self._stop.set()

    def end_lease(self, reason: str, fault: bool = False) -> None:
        """End the current lease (a serving host goes on serving; a dedicated executor stops). ``fault``: the
        rollout side failed (its engine is stopped, never kept inactive)."""
        if self.options.role != "serving":
            self.request_stop(reason)
        elif self._session is not None and not self._lease_over.is_set():
            log.info("lease with %s ends: %s", self.lent_to or "the controller", reason)
            self._lease_reason, self._lease_fault = reason, fault
            self._lease_over.set()

    # ---------------------------------------------------------------- the whole life

    async def run(self) -> int:
        self._install_signal_handlers()
        opts = self.options
        host = self._host = Host(HostPlan(self.config, opts.role, self.executor_id, self.device, opts.controller,
                                          opts.credential.weights, opts.metrics_endpoint), self._launcher)
        try:
            if self.options.role == "serving":
                await start_production(host)
                log.info("serving on %s; lent to the RL jobs at %s as they come", host.serving_endpoint(),
                         self.options.controller)
            while not self._stop.is_set():
                session = await self._attach()
                if session is None:
                    break
                await self._lend(session)
                if self.options.role != "serving":
                    break
        finally:
            await self._shutdown()
        return self.exit_code

    async def _attach(self) -> ControllerSession | None:
        """A session welcomed by a job's controller; ``None`` once stopping. A dedicated executor's first failure
        is its error; a serving host serves meanwhile and says Hello again (at once after a wait for a Welcome
        that timed out: the Hello it queued reaches a controller that starts meanwhile; ``lend_retry_s`` after a
        refusal, such as ``released`` from the job that just ended)."""
        serving, last, host = self.options.role == "serving", "", self._host
        if self._failed_starts:  # do not let a job whose engine will not start cost production a start a second
            await _unless_stopped(self._stop, asyncio.sleep(min(300.0, self.config.lend_retry_s * 2 ** self._failed_starts)))
        while not self._stop.is_set() and not self._launcher_gone():
            session = ControllerSession(self._link(), self.executor_id, self.options.controller,
                                        self.config.welcome_timeout_s, lambda: host_state(host, self._stop.is_set()),
                                        self.request_stop, self.end_lease)
            try:
                welcome = await _unless_stopped(self._stop, session.handshake(encrypted=self.config.encrypt_control))
            except (NoWelcome, Refused) as exc:
                await session.link.close(flush_s=0)
                if not serving:
                    raise
                if str(exc) != last:
                    log.warning("no RL job takes this serving host yet (%s); serving alone, trying again", exc)
                last = str(exc)
                if isinstance(exc, Refused):
                    await _unless_stopped(self._stop, asyncio.sleep(self.config.lend_retry_s))
                continue
            if welcome is None:
                await session.link.close(flush_s=0)
                return None
            self._session, self.lent_to = session, welcome.controller_id
            return session
        return None

    async def _lend(self, session: ControllerSession) -> None:
        """One lease: the job's rollout side started, registered, served until the lease ends or a stop."""
        host = self._host
        assert host is not None and session.welcome is not None
        self._lease_over.clear()
        self._lease_reason, self._lease_fault = "", False
        try:
            try:
                await start_lending(host, _policy_dir(session.welcome, self.config.rollout.model_dir),
                                    session.link.send, self._revoke_on_pressure)
            except Exception as exc:
                if self.options.role != "serving":
                    raise
                log.error("the job's rollout engine did not start (%s); the lease ends, serving goes on", exc)
                self._lease_reason, self._lease_fault = f"the rollout side did not start: {exc}"[:500], True
                self._failed_starts += 1
                return
            self._failed_starts = 0
            session.host = host
            if not self._stop.is_set():
                if self.options.freeze_heap and not self.leases:
                    freeze_startup_heap()
                session.register()
                log.info("executor %s registered with %s as %s", self.executor_id, self.lent_to, self.options.role)
                await self._serve(session)
        finally:
            await self._end_lease(session, self._lease_reason or self._stop_reason or "stopped")

    def _link(self) -> ControllerLink:
        connect = self._connect
        if self.config.encrypt_control and connect is LoopControlClient:
            connect = partial(LoopControlClient, encrypt_with=self.options.credential.observer)
        return ControllerLink(self.options.controller, self.options.credential.control, self.executor_id, connect)

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
        log.warning("revoked: %s; giving every rollout turn back and ending the lease, serving goes on", why)
        self._session.send_heartbeat()  # the controller re-routes before the turns come back one by one
        self._revoking = asyncio.get_running_loop().create_task(_give_back_and_end(runner, self.end_lease, why))

    def _revoke_on_pressure(self, seconds: float) -> None:
        self.revoke(f"serving had no SLO headroom for {seconds:.0f} s (revoke_after_pressure_s)")

    # ---------------------------------------------------------------- steady state

    async def _serve(self, session: ControllerSession) -> None:
        loops: list[Coroutine[Any, Any, None]] = [session.heartbeats(self._alive), session.dispatch()]
        if self._host is not None and self._host.co_serving is not None:
            loops.append(self._host.co_serving.run())
        tasks = [asyncio.create_task(coro) for coro in loops]
        ends = [asyncio.create_task(self._stop.wait()), asyncio.create_task(self._lease_over.wait())]
        try:
            done, _ = await asyncio.wait([*ends, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                failure = None if task in ends else task.exception()
                if failure is not None and self.options.role != "serving":
                    raise failure
                if failure is not None:  # the job's side failed (its engine died under a call): production stays
                    why = "the rollout engine died" if _rollout_dead(self._host) else "the lease's work failed"
                    log.error("%s: %r", why, failure, exc_info=failure)
                    self.end_lease(f"{why}: {failure!r}"[:500], fault=True)
        finally:
            for task in [*ends, *tasks]:
                task.cancel()
            await asyncio.gather(*ends, *tasks, return_exceptions=True)

    def _alive(self) -> bool:
        """Whether to go on heartbeating: no engine died and the launcher is still there. A dead serving engine
        stops the executor; a dead rollout engine ends the lease on a serving host (production goes on)."""
        host = self._host
        if host is not None and host.serving is not None and host.serving.errored:
            self.request_stop("the serving engine died; see the log above", exit_code=1)
            return False
        if self._controller_gone():
            return False
        if _rollout_dead(host):
            if self.options.role == "serving":
                self.end_lease("the rollout engine died; see the log above", fault=True)
            else:
                self.request_stop("a vLLM engine died; see the log above", exit_code=1)
            return False
        return not self._launcher_gone()

    def _controller_gone(self) -> bool:
        """A serving host ends the lease once the link to its job's controller was down ``lease_expiry_s``."""
        session, expiry = self._session, self.config.lease_expiry_s
        down = session.link.down_for(time.monotonic()) if session is not None else 0.0
        if self.options.role == "serving" and 0 < expiry < down:
            self.end_lease(f"the job's controller is gone (no link for {down:.0f} s, lease_expiry_s)")
            return True
        return False

    def _launcher_gone(self) -> bool:
        """Whether `rose run`, which started this executor, is gone (then stop: nothing else ever would)."""
        parent = self.options.parent_pid
        if parent is not None and os.getppid() != parent:
            self.request_stop(f"its launcher (pid {parent}) is gone", exit_code=1)
            return True
        return False

    # ---------------------------------------------------------------- the end

    async def _end_lease(self, session: ControllerSession, reason: str) -> None:
        """Give the turns back, say Goodbye, stop the job's rollout side, close the link."""
        host = self._host
        revoking = [self._revoking] if self._revoking is not None else []
        await asyncio.gather(*revoking, *session.rejoin_aborts, return_exceptions=True)
        self._revoking = None
        if host is not None:
            await give_turns_back(host, "shutdown" if self._stop.is_set() else "released")
        session.link.send(Goodbye(peer_id=self.executor_id, reason=reason))
        if host is not None:
            await stop_lending(host, keep=self.config.rollout.keep_between_leases and not (
                self._lease_fault or self._stop.is_set()))
        await session.link.close()
        self.rejoins_before += session.rejoins
        self._session, self.lent_to = None, ""
        self.leases += 1

    async def _shutdown(self) -> None:
        host = self._host
        if host is not None:
            await host.stop()
        else:
            await asyncio.to_thread(self._launcher.close)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                loop.remove_signal_handler(sig)


async def _give_back_and_end(runner: RolloutRunner, end_lease: Callable[[str], None], why: str) -> None:
    """A revocation: every turn in flight given back, then the lease ends."""
    await runner.revoke()
    end_lease(f"revoked: {why}")


async def _unless_stopped(stop: asyncio.Event, work: Coroutine[Any, Any, Welcome | None]) -> Welcome | None:
    """``work``'s result, or ``None`` if ``stop`` is set first (``work`` is cancelled)."""
    task, stopped = asyncio.ensure_future(work), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, stopped, return_exceptions=True)
    return task.result() if not task.cancelled() else None


def _policy_dir(welcome: Welcome, own: str) -> str:
    """The job's policy when the Welcome names one this host has; else the executor's own (``own``)."""
    named = welcome.policy_model_dir
    if named and named != own:
        if Path(named).is_dir():
            return named
        log.warning("the job's policy %s is not on this host: lending with %s", named, own)
    return own


def _rollout_dead(host: Host | None) -> bool:
    return host is not None and host.rollout is not None and host.rollout.errored
