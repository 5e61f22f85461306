"""What an executor runs on its host, in two parts: production (a serving host's lease of its endpoint, its
serving engine behind vLLM's OpenAI app), which stands for the life of the process, and the lending side (the
job's rollout engine, the rollout runner, the co-serving guard and its serving monitor, the weight updater, the
rollout engine's memory they share), which lives for one lease: one RL job.

``start_production`` starts the first (serving hosts only); ``start_lending`` the second for a job, and
``stop_lending`` stops it at the end of the lease, its rollout engine's memory given back, production untouched.
``Host.stop`` stops what was started, endpoint and lease first, engines last.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rose_core.config.executor_config import ExecutorConfig
from rose_core.protocol.messages import Register, Role
from rose_executor import metrics
from rose_executor.agent.inactive_policy import InactivePolicy, activate, deactivate
from rose_executor.co_serving.co_serving import CoServing, slo_budgets
from rose_executor.engine.engine_launcher import EngineLauncher
from rose_executor.engine.engine_protocol import Engine
from rose_executor.engine.engine_settings import engine_spec_for
from rose_executor.engine.engine_spec import Purpose
from rose_executor.host.device import Device, describe_device
from rose_executor.host.lending_lease import Holder, LendingLease
from rose_executor.memory.serving_first_budget import memory_budget, rollout_engine_bytes, serving_host_bytes
from rose_executor.profile.colocated_profile import load_or_profile_colocated
from rose_executor.profile.latency_profile import load_or_profile
from rose_executor.profile.model_info import describe_model
from rose_executor.rollout.engine_memory import EngineMemory
from rose_executor.rollout.rollout_runner import Reply, RolloutRunner
from rose_executor.serving.alone_calibration import AloneCalibration
from rose_executor.serving.openai_server import EndpointOptions, OpenAIServer
from rose_executor.serving.serving_monitor import ServingMonitor
from rose_executor.weights.weight_updater import WeightUpdater

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HostPlan:
    """Who this host is, for building it: its config, role, id, device, the controller it serves, its keys."""

    config: ExecutorConfig
    role: Role
    executor_id: str
    device: Device
    controller: str
    weights_key: bytes
    metrics_endpoint: str = ""


@dataclass(slots=True)
class Host:
    """What ``start_production`` and ``start_lending`` started (``None``: not on this role, or not now)."""

    plan: HostPlan
    launcher: EngineLauncher
    engines: list[Engine] = field(default_factory=list)
    serving: Engine | None = None
    server: OpenAIServer | None = None
    lease: LendingLease | None = None
    rollout: Engine | None = None
    """The lent job's rollout engine (``None`` between leases)."""
    rollout_model_dir: str = ""
    runner: RolloutRunner | None = None
    co_serving: CoServing | None = None
    monitor: ServingMonitor | None = None
    updater: WeightUpdater | None = None
    engine_memory: EngineMemory | None = None
    """The lease's rollout engine memory (shared by the guard and the updater)."""
    inactive: InactivePolicy | None = None
    """The pre-deployed policy kept between leases (``[rollout] keep_between_leases``)."""
    alone: AloneCalibration | None = None
    """``[slo] from_alone``: the SLO this host measures once, on production served alone (between leases, and
    at its first lease while the guard holds every turn), and keeps for every lease."""

    def calibration(self) -> AloneCalibration:
        slo = self.plan.config.slo
        if self.alone is None:
            self.alone = AloneCalibration(slo.from_alone, slo.calibration_requests)
        return self.alone

    def observe_alone(self) -> None:
        """Between leases: production's finished requests go to the calibration (``[slo] from_alone``), else to
        nobody."""
        if self.serving is not None:
            self.serving.attach_observer(self.calibration() if self.plan.config.slo.from_alone > 0 else None)

    def register_message(self) -> Register:
        plan, cfg = self.plan, self.plan.config
        models = [describe_model(self.rollout_model_dir or cfg.rollout.model_dir, "rollout")]
        if plan.role == "serving":
            models.insert(0, describe_model(cfg.serving.model_dir, "serving", cfg.serving.model_name))
        device = describe_device(plan.device)
        return Register(
            executor_id=plan.executor_id, role=plan.role, device=device.device, host=cfg.advertise_host,
            models=models, memory_bytes=device.memory_bytes, rollout_capacity=cfg.rollout.capacity,
            serving_endpoint=self.serving_endpoint(), metrics_endpoint=plan.metrics_endpoint,
            weight_version=self.runner.weight_version if self.runner else 0,
        )

    def serving_endpoint(self) -> str:
        if self.server is None:
            return ""
        host = self.server.host
        if host in ("0.0.0.0", "::", ""):
            host = self.plan.config.advertise_host
        return f"{self.server.scheme}://{host}:{self.server.port}/v1"

    async def stop(self) -> None:
        """Stop the endpoint and release the lease, then every engine (in parallel), then the launcher."""
        if self.updater is not None:
            await self.updater.close()
        if self.server is not None:
            await self.server.stop()
        if self.lease is not None:
            self.lease.release()
        started = time.perf_counter()
        await asyncio.gather(*(asyncio.to_thread(engine.shutdown) for engine in self.engines))
        if self.engines:
            log.info("%d engines stopped in %.1f s", len(self.engines), time.perf_counter() - started)
        self.engines.clear()
        self.serving = None
        await asyncio.to_thread(self.launcher.close)


async def start_production(host: Host) -> None:
    """A serving host's production, which no RL job starts or stops: the lease of its endpoint (one process lends
    it), the serving engine, vLLM's OpenAI app serving it."""
    cfg = host.plan.config
    host.server = OpenAIServer(cfg.serving.host, cfg.serving.port, EndpointOptions.of(cfg.serving))
    if cfg.serving.port:
        _take_lease(host, f"{cfg.serving.host}:{cfg.serving.port}")  # before the bind: name the holder
    host.server.reserve()
    if not cfg.serving.port:
        _take_lease(host, f"{cfg.serving.host}:{host.server.port}")
    host.serving = await _start_engine(host, cfg.serving.model_dir, "serving")
    await host.server.start(host.serving, cfg.serving.model_name)
    if cfg.rollout.keep_between_leases:  # pre-deploy the policy, inactive until a job takes the host
        engine = await _start_engine(host, cfg.rollout.model_dir, "rollout")
        await _check_patchable(engine, cfg.rollout.model_dir)
        await _as_rollout_work(host, engine)
        host.inactive = await deactivate(engine, cfg.rollout.model_dir, 0, EngineMemory(engine, cfg.rollout.call_timeout_s))
    host.observe_alone()
    _report_lease(host, lent_bytes=0)


async def start_lending(host: Host, model_dir: str, send: Reply,
                        on_sustained_pressure: Callable[[float], None]) -> None:
    """Start the lending side for one job into ``host`` (what started is in ``host`` if this raises): the rollout
    engine on the job's policy ``model_dir``, the runner, on a serving host the guard, the weight updater.
    ``send``: to that job's controller. ``on_sustained_pressure``: what the guard calls when serving had no
    headroom for ``revoke_after_pressure_s`` (the agent revokes the host)."""
    plan, cfg = host.plan, host.plan.config
    started = time.perf_counter()
    if host.serving is not None:  # a rollout engine starting beside it: production no longer served alone
        host.serving.attach_observer(None)
    host.rollout_model_dir = model_dir
    rollout, version, engine_memory, how = await _rollout_engine(host, model_dir)
    host.engine_memory = engine_memory
    _report_lease(host, lent_bytes=rollout_engine_bytes(cfg, plan.device, model_dir))
    memory = (memory_budget(cfg, plan.device, (host.serving.kv_cache_tokens(), rollout.kv_cache_tokens()), model_dir)
              if host.serving is not None else None)
    host.runner = RolloutRunner(rollout, plan.executor_id, cfg.rollout.capacity, send, weight_version=version,
                                guarded=host.serving is not None, memory=memory)
    if host.serving is not None:
        await _start_guard(host, (host.serving, rollout), host.runner, engine_memory, on_sustained_pressure)
    host.updater = WeightUpdater(
        host.runner, rollout, executor_id=plan.executor_id, secret=plan.weights_key, send=send,
        fetch_timeout_s=cfg.weights.fetch_timeout_s, drain_timeout_s=cfg.weights.drain_timeout_s,
        relay=cfg.weights.relay, engine_memory=engine_memory,
    )
    metrics.LEASE_START_SECONDS.labels(how).observe(time.perf_counter() - started)


async def _rollout_engine(host: Host, model_dir: str) -> tuple[Engine, int, EngineMemory, str]:
    """The lease's rollout engine, the version it holds, its memory, and how it came: the inactive policy
    activated when it is ``model_dir``'s, else a started engine (an inactive one of another policy stopped
    first: its memory goes to the new one)."""
    kept, host.inactive = host.inactive, None
    if kept is not None and kept.model_dir == model_dir:
        host.rollout = kept.engine  # stopped with the lease if activating it fails
        await activate(kept)
        return kept.engine, kept.version, kept.memory, "activated"
    if kept is not None:
        await _stop_engine(host, kept.engine)
    engine = host.rollout = await _start_engine(host, model_dir, "rollout")  # stopped with the lease if not fit
    await _check_patchable(engine, model_dir)
    await _as_rollout_work(host, engine)
    return engine, 0, EngineMemory(engine, host.plan.config.rollout.call_timeout_s), "started"


async def _check_patchable(engine: Engine, model_dir: str) -> None:
    """Refuse at start a rollout engine whose weights ROSE could not update in place (its first update would
    fail): quantized or fused layouts, names the checkpoint lacks, a model it cannot split over the engine's
    tensor-parallel ranks, pipeline stages."""
    await engine.check_weights(model_dir)


async def _as_rollout_work(host: Host, engine: Engine) -> None:
    """On a serving host, the rollout engine's processes at the rollout side's CPU priority (``[rollout] nice``):
    production's CPU work, a weight apply's included, runs first (``host/cpu_priority.py``)."""
    nice = host.plan.config.rollout.nice
    if host.serving is not None and nice > 0:
        await engine.lower_cpu_priority(nice)


async def give_turns_back(host: Host, why: str) -> None:
    """Refuse the lease's later turns and give back every one in flight (``why``: their abort reason)."""
    if host.runner is not None:
        host.runner.refuse(why)
        log.info("gave back %d in-flight turns", await host.runner.abort_all(why))


async def stop_lending(host: Host, keep: bool = False) -> None:
    """The end of a lease: the updater closed, the guard and monitor let go of serving, the rollout engine
    stopped (its memory goes back to serving), or with ``keep`` on a serving host made the inactive policy
    (``inactive_policy``; stopped if that fails); production untouched. The agent has given the turns back."""
    pristine = host.updater is None or not host.updater.touched
    version = host.runner.weight_version if host.runner is not None and pristine else -1
    if host.updater is not None:
        await host.updater.close()
    if host.serving is not None:
        host.serving.attach_observer(None)
    memory, model_dir = host.engine_memory, host.rollout_model_dir
    host.updater = host.co_serving = host.monitor = host.runner = host.engine_memory = None
    rollout, host.rollout, host.rollout_model_dir = host.rollout, None, ""
    if rollout is not None:
        metrics.LEASES_ENDED.inc()
        if keep and host.serving is not None and memory is not None and not rollout.errored:
            try:
                host.inactive = await deactivate(rollout, model_dir, version, memory)
            except Exception as exc:
                log.warning("could not keep the rollout engine inactive (%s); stopping it", exc)
        if host.inactive is None or host.inactive.engine is not rollout:
            await _stop_engine(host, rollout)
    host.observe_alone()
    _report_lease(host, lent_bytes=0)


async def _stop_engine(host: Host, engine: Engine) -> None:
    host.engines.remove(engine)
    started = time.perf_counter()
    await asyncio.to_thread(engine.shutdown)
    log.info("rollout engine stopped in %.1f s; serving goes on alone", time.perf_counter() - started)


def _report_lease(host: Host, lent_bytes: int) -> None:
    """The lease gauges: lent or not, what the rollout engine holds (a kept inactive one that could not release
    its memory, as on CPU, still holds it), what serving may use (the host's whole share less that)."""
    kept = host.inactive
    held = lent_bytes or (rollout_engine_bytes(host.plan.config, host.plan.device, kept.model_dir)
                          if kept is not None and not kept.memory.released else 0)
    metrics.LEASE_ACTIVE.set(1 if lent_bytes else 0)
    metrics.ROLLOUT_ENGINE_BYTES.set(held)
    if not lent_bytes:
        metrics.ROLLOUT_BUDGET_BYTES.set(0)
    if host.serving is not None:
        metrics.SERVING_BUDGET_BYTES.set(max(0, serving_host_bytes(host.plan.config, host.plan.device) - held))


def _take_lease(host: Host, endpoint: str) -> None:
    """One process lends a serving endpoint: hold its lease, or raise ``AlreadyLent`` naming who holds it."""
    lease = LendingLease(endpoint)
    lease.acquire(Holder(host.plan.executor_id, host.plan.controller, ""))
    host.lease = lease


async def _start_engine(host: Host, model_dir: str, purpose: Purpose) -> Engine:
    started = time.perf_counter()
    spec = engine_spec_for(host.plan.config, host.plan.device, Path(model_dir), purpose)
    engine = await host.launcher.start(spec)
    host.engines.append(engine)
    log.info("%s engine for %s ready in %.1f s", purpose, model_dir, time.perf_counter() - started)
    return engine


async def _start_guard(host: Host, engines: tuple[Engine, Engine], runner: RolloutRunner, engine_memory: EngineMemory,
                       on_sustained_pressure: Callable[[float], None]) -> None:
    """Profile both engines (or load the cached profiles), then let the monitor see serving traffic."""
    cfg, (serving, rollout) = host.plan.config, engines
    cache = Path(cfg.profile_cache_dir) if cfg.profile_cache_dir else None
    profiles = (await load_or_profile(serving, cache), await load_or_profile(rollout, cache))
    colocated = await load_or_profile_colocated(serving, rollout, cache) if cfg.slo.colocated_profile else None
    basis = (f"{cfg.slo.from_profile:g} x the start-up profile's serving alone" if cfg.slo.from_profile > 0
             else "the executor's [slo] ttft_ms and tpot_ms")
    host.monitor = monitor = ServingMonitor(slo_budgets(cfg, profiles[0]) or host.calibration(),
                                            cfg.slo.headroom_fraction, cfg.slo.latency_window_s, basis=basis)
    host.co_serving = CoServing.build(cfg, profiles, engines, runner, colocated, slo=lambda: monitor.slo,
                                      engine_memory=engine_memory, on_sustained_pressure=on_sustained_pressure)
    if cfg.slo.p99_feedback:
        host.co_serving.set_feedback(monitor.has_headroom)
    serving.attach_observer(host.monitor)
