"""The per-host executor agent: one asyncio program that owns this host's engines and talks to the controller.

Flow: Hello -> Welcome, start the engines (and, on a serving host, the OpenAI endpoint), Register, then
heartbeat with a ``LoadReport`` while handling turns, cancellations, weight announcements and steps, until
``Shutdown`` or SIGINT/SIGTERM: give in-flight turns back, say Goodbye, stop the engines.

One RL job per serving host: a serving executor holds the lending lease of its endpoint
(``lending_lease``); one started for the same endpoint by another job tells its controller who holds it
(``ErrorReport`` ``already_lent``) and stops.

A controller that restarted (or lost this executor) answers its next message with ``no_handshake`` or
``not_registered``: the executor joins it again (Hello, Welcome, Register) and gives back the turns the old
one sent; its engines and production serving never stop. While the controller is down, what the executor
sends is queued or dropped by the channel (``rose_core.channel``), never waited on.

Revocation (serving role): SIGUSR1 (``rose-executor revoke``), or serving without SLO headroom for
``revoke_after_pressure_s``, takes the host back from the RL job: a heartbeat saying ``revoked`` goes out at
once (the controller re-routes this host's turns and borrows no more of it), then every in-flight turn is
given back (``revoked``); serving goes on, and every later turn is refused until the executor restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import assert_never

from rose_core.auth import ExecutorCredential
from rose_core.channel import LoopControlClient
from rose_core.errors import RoseError
from rose_core.heap import freeze_startup_heap
from rose_core.messages import (
    CancelTurn,
    ErrorReport,
    FromController,
    Goodbye,
    Heartbeat,
    Hello,
    LoadReport,
    Register,
    Role,
    Shutdown,
    StatusSnapshot,
    StepStarted,
    ToController,
    TurnRequest,
    WeightAnnounce,
    Welcome,
)
from rose_core.wire import is_unsigned_notice
from rose_executor import __version__
from rose_executor.co_serving.co_serving import CoServing
from rose_executor.co_serving.colocated_profile import load_or_profile_colocated
from rose_executor.config import ExecutorConfig
from rose_executor.controller_link import ClientFactory, ControllerLink
from rose_executor.engine.device import describe_device, resolve_device
from rose_executor.engine.engine_launcher import EngineLauncher, VllmLauncher
from rose_executor.engine.engine_protocol import Engine
from rose_executor.engine.engine_settings import engine_spec_for
from rose_executor.engine.engine_spec import Purpose
from rose_executor.engine.latency_profile import load_or_profile
from rose_executor.engine.model_info import describe_model
from rose_executor.lending_lease import AlreadyLent, Holder, LendingLease
from rose_executor.memory.serving_first_budget import memory_budget
from rose_executor.rollout.rollout_runner import RolloutRunner
from rose_executor.rollout.weight_updater import WeightUpdater
from rose_executor.serving.openai_server import OpenAIServer
from rose_executor.serving.serving_monitor import ServingMonitor

log = logging.getLogger(__name__)
REJOIN_CODES = ("no_handshake", "not_registered")
"""What a controller that does not know this executor answers (signed): join it again."""


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """What the command line says about this executor (the config file says the rest)."""

    controller: str
    role: Role
    executor_id: str
    credential: ExecutorCredential
    """Its own control key, the weights key and the observer key (``rose_core.auth.executor_credential``)."""
    metrics_endpoint: str = ""
    parent_pid: int | None = None
    """The launcher (`rose run`): when it is gone (this process was re-parented), the executor stops; a
    controller killed with SIGKILL must not leave its executors running (nothing would ever stop them)."""
    freeze_heap: bool = True
    """Freeze the startup heap out of full GC passes once the engines run (``rose_core.heap``): this process is
    an executor's. An agent run inside another program (a test's) leaves that program's heap alone."""


class ExecutorAgent:
    """Runs until told to stop; ``run`` returns the process exit code, or raises ``RoseError`` at start-up."""

    def __init__(
        self,
        config: ExecutorConfig,
        options: AgentOptions,
        launcher: EngineLauncher | None = None,
        connect: ClientFactory = LoopControlClient,
    ) -> None:
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
        self._link: ControllerLink | None = None
        self._heartbeat_s = config.heartbeat_interval_s
        self._welcomed = False
        self._serving: Engine | None = None
        self._engines: list[Engine] = []
        self._monitor: ServingMonitor | None = None
        self._co_serving: CoServing | None = None
        self._server: OpenAIServer | None = None
        self._runner: RolloutRunner | None = None
        self._updater: WeightUpdater | None = None
        self._revoking: asyncio.Task[int] | None = None
        self._controller_id = ""
        self._lease: LendingLease | None = None
        self._heartbeat_seq = 0
        self._rejoining: float | None = None  # when this executor sent Hello to a controller that lost it
        self._rejoin_aborts: list[asyncio.Future[None]] = []
        self.rejoins = 0

    @property
    def executor_id(self) -> str:
        return self.options.executor_id

    def request_stop(self, reason: str, exit_code: int = 0) -> None:
        if not self._stop.is_set():
            log.info("stopping: %s", reason)
            self._stop_reason = reason
            self.exit_code = exit_code
            self._stop.set()

    # ---------------------------------------------------------------- the whole life

    async def run(self) -> int:
        self._install_signal_handlers()
        try:
            connect = self._connect
            if self.config.encrypt_control and connect is LoopControlClient:
                connect = partial(LoopControlClient, encrypt_with=self.options.credential.observer)
            self._link = ControllerLink(self.options.controller, self.options.credential.control, self.executor_id,
                                        connect)
            welcome = await self._handshake(self._link)
            self._welcomed = True
            self._heartbeat_s = welcome.heartbeat_interval_s
            self._controller_id = welcome.controller_id
            await self._start_engines()
            if not self._stop.is_set():
                if self.options.freeze_heap:
                    freeze_startup_heap()
                self._link.send(self._register_message())
                log.info(
                    "executor %s registered with %s as %s", self.executor_id, welcome.controller_id, self.options.role
                )
                await self._serve(self._link)
        finally:
            await self._shutdown()
        return self.exit_code

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop, f"received {signal.Signals(sig).name}")
        loop.add_signal_handler(signal.SIGUSR1, self.revoke, "the serving owner sent SIGUSR1 (rose-executor revoke)")

    def revoke(self, why: str) -> None:
        """Take this serving host back from the RL job (see the module docstring); idempotent."""
        runner = self._runner
        if self.options.role != "serving":
            log.warning("ignored a revocation (%s): a dedicated executor is not lent, stop it instead", why)
            return
        if runner is None or runner.revoked or self._link is None:
            return
        runner.revoked = True
        log.warning("revoked: %s; giving every rollout turn back, serving goes on", why)
        self._send_heartbeat(self._link)  # the controller re-routes before the turns come back one by one
        self._revoking = asyncio.get_running_loop().create_task(runner.revoke())

    async def _handshake(self, link: ControllerLink) -> Welcome:
        link.send(Hello(peer_id=self.executor_id, kind="executor", software=f"rose-executor {__version__}"))
        deadline = time.monotonic() + self.config.welcome_timeout_s
        notice: ErrorReport | None = None
        while (left := deadline - time.monotonic()) > 0:
            msg = await link.recv(timeout=left)
            if isinstance(msg, Welcome):
                return msg
            if is_unsigned_notice(msg):
                notice = msg  # anyone can send one: shown (and in the error at the timeout), never acted on
                log.warning("unsigned notice (cannot be verified) from %s: %s: %s", self.options.controller,
                            msg.code, msg.message)
            elif isinstance(msg, ErrorReport):
                raise RoseError(f"the controller refused this executor ({msg.code}): {msg.message}")
        waited = f"no Welcome from the controller at {self.options.controller} within {self.config.welcome_timeout_s:g} s"
        if notice is not None:
            raise RoseError(f"{waited}; it answered with an unsigned notice ({notice.code}): {notice.message}")
        encrypted = "" if self.config.encrypt_control else " (and, if it encrypts, set encrypt_control = true)"
        raise RoseError(f"{waited}: check --controller and that the controller is running{encrypted}")

    # ---------------------------------------------------------------- engines

    async def _start_engines(self) -> None:
        cfg = self.config
        if self.options.role == "serving":
            self._server = OpenAIServer(cfg.serving_host, cfg.serving_port)
            if cfg.serving_port:
                self._take_lease(f"{cfg.serving_host}:{cfg.serving_port}")  # before the bind: name the holder
            self._server.reserve()
            if not cfg.serving_port:
                self._take_lease(f"{cfg.serving_host}:{self._server.port}")
            self._serving = await self._start_engine(cfg.serving_model_dir, "serving")
        rollout = await self._start_engine(cfg.policy_model_dir, "rollout")
        memory = memory_budget(cfg, self.device) if self._serving is not None else None
        send = self._send
        self._runner = RolloutRunner(
            rollout,
            self.executor_id,
            cfg.rollout_capacity,
            send,
            weight_version=0,
            guarded=self._serving is not None,
            memory=memory,
        )
        if self._serving is not None and self._server is not None:
            await self._start_guard(self._serving, rollout, self._runner)
            await self._server.start(self._serving, cfg.serving_model_name)
        self._updater = WeightUpdater(
            self._runner,
            rollout,
            executor_id=self.executor_id,
            secret=self.options.credential.weights,
            send=send,
            fetch_timeout_s=cfg.weight_fetch_timeout_s,
            drain_timeout_s=cfg.weight_drain_timeout_s,
            relay=cfg.weight_relay,
        )
        if self._co_serving is not None:  # an update wakes a released engine; the guard keeps it awake meanwhile
            updater, co_serving = self._updater, self._co_serving
            updater.awaken = co_serving.awaken
            co_serving.keep_memory = lambda: updater.updating

    def _take_lease(self, endpoint: str) -> None:
        """One RL job per serving host: hold its lending lease, or tell the controller who holds it and stop."""
        lease = LendingLease(endpoint)
        try:
            lease.acquire(Holder(self.executor_id, self.options.controller, self._controller_id))
        except AlreadyLent as exc:
            self._send(ErrorReport(code="already_lent", message=str(exc)[:500]))
            raise
        self._lease = lease

    async def _start_guard(self, serving: Engine, rollout: Engine, runner: RolloutRunner) -> None:
        """Profile both engines (or load the cached profiles), then let the monitor see serving traffic."""
        cfg = self.config
        cache = Path(cfg.profile_cache_dir) if cfg.profile_cache_dir else None
        profiles = (await load_or_profile(serving, cache), await load_or_profile(rollout, cache))
        colocated = await load_or_profile_colocated(serving, rollout, cache) if cfg.colocated_profile else None
        self._co_serving = CoServing.build(cfg, profiles, (serving, rollout), runner, colocated)
        self._co_serving.on_sustained_pressure = lambda seconds: self.revoke(
            f"serving had no SLO headroom for {seconds:.0f} s (revoke_after_pressure_s)")
        admission = self._co_serving.guard.admission.config
        self._monitor = ServingMonitor(
            admission.ttft_budget_s, admission.tpot_budget_s, cfg.headroom_fraction, cfg.latency_window_s
        )
        if cfg.p99_feedback:
            self._co_serving.set_feedback(self._monitor.has_headroom)
        serving.attach_observer(self._monitor)

    async def _start_engine(self, model_dir: str, purpose: Purpose) -> Engine:
        cfg = self.config
        started = time.perf_counter()
        spec = engine_spec_for(cfg, self.device, Path(model_dir), purpose)
        engine = await self._launcher.start(spec)
        self._engines.append(engine)
        log.info("%s engine for %s ready in %.1f s", purpose, model_dir, time.perf_counter() - started)
        return engine

    def _register_message(self) -> Register:
        cfg = self.config
        models = [describe_model(cfg.policy_model_dir, "rollout")]
        if self.options.role == "serving":
            models.insert(0, describe_model(cfg.serving_model_dir, "serving", cfg.serving_model_name))
        device = describe_device(self.device)
        return Register(
            executor_id=self.executor_id,
            role=self.options.role,
            device=device.device,
            host=cfg.advertise_host,
            models=models,
            memory_bytes=device.memory_bytes,
            rollout_capacity=cfg.rollout_capacity,
            serving_endpoint=self._serving_endpoint(),
            metrics_endpoint=self.options.metrics_endpoint,
            weight_version=self._runner.weight_version if self._runner else 0,
        )

    def _serving_endpoint(self) -> str:
        if self._server is None:
            return ""
        host = self._server.host
        if host in ("0.0.0.0", "::", ""):
            host = self.config.advertise_host
        return f"http://{host}:{self._server.port}/v1"

    # ---------------------------------------------------------------- steady state

    async def _serve(self, link: ControllerLink) -> None:
        loops = [self._heartbeat_loop(link), self._dispatch_loop(link)]
        if self._co_serving is not None:
            loops.append(self._co_serving.run())
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

    async def _heartbeat_loop(self, link: ControllerLink) -> None:
        while True:
            if any(engine.errored for engine in self._engines):
                self.request_stop("a vLLM engine died; see the log above", exit_code=1)
                return
            parent = self.options.parent_pid
            if parent is not None and os.getppid() != parent:
                self.request_stop(f"its launcher (pid {parent}) is gone", exit_code=1)
                return
            if self._rejoining is not None and time.monotonic() - self._rejoining > self.config.welcome_timeout_s:
                self._rejoining = None  # no Welcome: the next message's no_handshake starts another attempt
            self._send_heartbeat(link)
            await asyncio.sleep(self._heartbeat_s)

    def _send_heartbeat(self, link: ControllerLink) -> None:
        seq, self._heartbeat_seq = self._heartbeat_seq, self._heartbeat_seq + 1
        link.send(Heartbeat(executor_id=self.executor_id, seq=seq, sent_at=time.time(), load=self.load_report()))

    async def _dispatch_loop(self, link: ControllerLink) -> None:
        while True:
            msg = await link.recv()
            if msg is not None:
                self._handle(msg)

    def _handle(self, msg: FromController) -> None:
        runner, updater = self._runner, self._updater
        if runner is None or updater is None:
            return
        match msg:
            case TurnRequest():
                runner.submit(msg)
            case CancelTurn():
                runner.cancel(msg.turn_id, msg.attempt)
            case WeightAnnounce():
                updater.announce(msg)
            case StepStarted():
                if self._co_serving is not None:
                    self._co_serving.on_step(msg.step)
            case Shutdown():
                self.request_stop(f"the controller asked ({msg.reason or 'no reason given'})")
            case ErrorReport():
                self._on_error_report(msg)
            case Welcome():
                self._on_welcome(msg)
            case StatusSnapshot():
                pass
            case _:
                assert_never(msg)

    def _on_error_report(self, msg: ErrorReport) -> None:
        log.warning("controller reports %s%s: %s", msg.code, " (unsigned)" if is_unsigned_notice(msg) else "",
                    msg.message)
        if msg.code in REJOIN_CODES and not is_unsigned_notice(msg):  # shown, never acted on
            self._rejoin(msg.code)

    def _rejoin(self, why: str) -> None:
        """The controller does not know this executor (it restarted): say Hello again; Register on its Welcome."""
        if self._rejoining is not None or self._link is None or self._stop.is_set():
            return
        self._rejoining = time.monotonic()
        log.warning("the controller answered %s: it restarted or lost this executor; joining it again "
                    "(engines and serving go on)", why)
        self._link.send(Hello(peer_id=self.executor_id, kind="executor", software=f"rose-executor {__version__}"))
        if self._runner is not None:  # the old controller's turns: the new one re-runs what it needs
            self._rejoin_aborts = self._runner.abort_now("controller_restarted")

    def _on_welcome(self, msg: Welcome) -> None:
        if self._rejoining is None or self._link is None:
            return
        self._rejoining = None
        self._heartbeat_s = msg.heartbeat_interval_s
        self._controller_id = msg.controller_id
        self._link.send(self._register_message())
        self.rejoins += 1
        log.info("executor %s registered again with %s as %s", self.executor_id, msg.controller_id, self.options.role)

    def load_report(self) -> LoadReport:
        runner = self._runner
        report = LoadReport(
            rollout_in_flight=runner.in_flight if runner else 0,
            rollout_capacity=self.config.rollout_capacity,
            rollout_budget_frozen=runner.budget_frozen if runner else False,
            rollout_tokens_total=runner.tokens_total if runner else 0,
            weight_version=runner.weight_version if runner else -1,
            warm_trajectories=runner.warm.ids(time.monotonic()) if runner else [],
            state=self._state(),
            rollout_held=self._held_turns(),
            rollout_aborted_total=runner.aborted_total if runner else 0,
            prefix_hit_ratio=runner.prefix_hit_rate if runner else 0.0,
            revoked=runner.revoked if runner else False,
            rollout_cancelled_total=runner.cancelled_total if runner else 0,
            cancelled_still_running=runner.cancelled_still_running if runner else 0,
        )
        memory = runner.memory if runner else None
        if memory is not None:
            report.rollout_budget_bytes = memory.budget_bytes
            report.emergency_cuts_total = memory.policy.cuts
        co = self._co_serving
        if co is not None:
            report.guard_hold_seconds_total = co.hold_seconds_total
            slack = co.last.min_slack_s if co.last is not None else math.inf
            report.guard_min_slack_ms = slack * 1000 if math.isfinite(slack) else 0.0
        if self._monitor is not None and self._serving is not None:
            snap = self._monitor.snapshot()
            report.serving_kv_usage_ratio = snap.kv_usage_ratio
            report.serving_ttft_p99_ms = snap.ttft_p99_s * 1000
            report.serving_tpot_p99_ms = snap.tpot_p99_s * 1000
            report.serving_requests_in_flight = self._serving.num_unfinished_requests()
            report.serving_requests_total = self._monitor.requests_total
            report.serving_slo_violations_total = self._monitor.violations_total
            report.slo_headroom = self._co_serving.headroom if self._co_serving else self._monitor.has_headroom()
        return report

    def _held_turns(self) -> int:
        if self._co_serving is not None:
            return self._co_serving.held_turns()
        return len(self._runner.queued()) if self._runner is not None else 0

    def _state(self) -> str:
        if self._stop.is_set():
            return "stopping"
        if self._runner is not None and self._runner.revoked:
            return "revoked"
        if self._updater is not None and self._updater.updating:
            return "updating"
        if self._runner is not None and self._runner.held:
            return "held"
        return "ready"

    def _send(self, msg: ToController) -> None:
        if self._link is not None:
            self._link.send(msg)

    # ---------------------------------------------------------------- the end

    async def _shutdown(self) -> None:
        reason = self._stop_reason or "stopped"
        if self._revoking is not None:
            await asyncio.gather(self._revoking, return_exceptions=True)
        await asyncio.gather(*self._rejoin_aborts, return_exceptions=True)
        if self._runner is not None:
            self._runner.refuse("shutdown")
            aborted = await self._runner.abort_all("shutdown")
            log.info("gave back %d in-flight turns", aborted)
        if self._updater is not None:
            await self._updater.close()
        if self._link is not None and self._welcomed:
            self._link.send(Goodbye(peer_id=self.executor_id, reason=reason))
        if self._server is not None:
            await self._server.stop()
        if self._lease is not None:
            self._lease.release()
        started = time.perf_counter()
        await asyncio.gather(*(asyncio.to_thread(engine.shutdown) for engine in self._engines))
        if self._engines:
            log.info("%d engines stopped in %.1f s", len(self._engines), time.perf_counter() - started)
        self._engines.clear()
        self._serving = None
        await asyncio.to_thread(self._launcher.close)
        if self._link is not None:
            await self._link.close()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                loop.remove_signal_handler(sig)
