"""`rose run`: the whole system on one machine, as separate processes talking the protocol.

The launcher owns the controller (this process), the trainer and the load generator, and starts every
executor as a child process (`python -m rose_executor`). Whatever happens (an error, Ctrl-C, SIGTERM), every
child is stopped before it returns.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import tomli_w

from rose_core.app.config import EXTERNAL_TRAINER, GATEWAY_ENV, RELAY_NONE, RELAY_START, RunConfig
from rose_core.app.controller.control_loop import ControlLoop
from rose_core.app.controller.controller import Controller
from rose_core.app.controller.executor_record import ExecutorRecord
from rose_core.app.jobs.external_trainer import ExternalTrainer
from rose_core.app.jobs.rl_job import RLJob
from rose_core.app.jobs.step_report import StepReport
from rose_core.app.run.child_processes import PARENT_PID, ChildProcesses
from rose_core.app.run.load_generator import LoadGenerator
from rose_core.app.run.run_report import RunReport
from rose_core.app.weight_publisher import WeightPublisher, WeightRelay, load_publisher
from rose_core.protocol.auth import (
    SECRET_FILE_ENV,
    load_secret,
    weights_key,
    write_executor_key,
    write_new_secret,
    write_observer_key,
)
from rose_core.protocol.messages import StepStatus
from rose_core.support.errors import MissingExtraError, RoseError
from rose_core.support.heap import freeze_startup_heap
from rose_core.support.metrics import serve_metrics

if TYPE_CHECKING:
    from rose_core.app.run.ray_executors import RayExecutors

log = logging.getLogger(__name__)
Say = Callable[[str], None]


def require_extras(need_executor: bool = True) -> None:
    """One clear line for each optional component `rose run` needs."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        raise MissingExtraError("the trainer (torch, transformers)", "rose-core[train]")
    if importlib.util.find_spec("rose_transfer") is None:
        raise MissingExtraError("rose-transfer (the weight data plane)", "rose-transfer")
    if not need_executor:
        return
    if importlib.util.find_spec("rose_executor") is None:
        raise MissingExtraError("rose-executor", "rose-executor[cpu]")
    if importlib.util.find_spec("vllm") is None:
        raise MissingExtraError("vLLM for the executors", "rose-executor[cpu]")


class Interrupted(KeyboardInterrupt):
    """What Ctrl-C and SIGTERM raise during a run, instead of a bare ``KeyboardInterrupt``.

    CPython flags a bare ``KeyboardInterrupt`` that leaves code run by ``exec()`` (a dataclass being created
    while torch or transformers import) as unhandled even when it is caught further up, and at exit kills
    itself with SIGINT whatever status it was asked to exit with (`rose run` then ended -2 instead of 130
    in about half of the interrupts). It checks the exception's type exactly: a subclass is not flagged."""


@contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread while the run goes."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


DEMO_SLO_FROM_PROFILE = 10.0
"""The embedded demo's serving SLO: a serving executor derives its TTFT / TPOT budgets from its start-up
profile, as this multiple of the serving-alone latency (prefill of a 512-token prompt; decode step at the full
serving batch); `[slo]` ttft_ms / tpot_ms then only judge the client-side latency in the run report."""


def executor_config(config: RunConfig, role: str, policy: Path, serving: Path, index: int) -> dict[str, Any]:
    """The `rose-executor --config` file for one local executor (its schema: rose_executor.config)."""
    ex = config.executors
    section: dict[str, Any] = {
        "policy_model_dir": str(policy),
        "kv_cache_gib": ex.kv_cache_gib,
        "rollout_capacity": ex.rollout_capacity,
        "slo_ttft_ms": config.slo.ttft_ms,
        "slo_tpot_ms": config.slo.tpot_ms,
        "headroom_fraction": config.slo.headroom_fraction,
        "encrypt_control": config.controller.encrypt,
    }
    if role == "serving":
        section.update(
            serving_model_dir=str(serving),
            serving_host="127.0.0.1",
            serving_port=0,
            slo_from_profile=DEMO_SLO_FROM_PROFILE,
        )
    section.update(ex.serving_overrides if role == "serving" else ex.dedicated_overrides)
    return section


def executor_log_level() -> str:
    """The executors log at DEBUG when `rose -vv` does (their logs: run_dir/logs), else at INFO."""
    return "DEBUG" if logging.getLogger().getEffectiveLevel() <= logging.DEBUG else "INFO"


class Launch:
    """Everything `rose run` starts, in the order it is stopped."""

    def __init__(self, config: RunConfig, say: Say, secret_file: str | None = None, spawn: bool = True) -> None:
        self.config = config
        self.say = say
        self.spawn = spawn
        self.run_dir = Path(config.run_dir).resolve()
        if spawn and secret_file is not None:  # the executors it starts read the same file
            self.secret = load_secret(secret_file)
            self.secret_path = Path(secret_file).resolve()
        elif spawn:
            self.secret_path = self.run_dir / "secret"
            self.secret = write_new_secret(self.secret_path)
        else:
            self.secret = load_secret(secret_file)
            self.secret_path = Path(secret_file or os.environ.get(SECRET_FILE_ENV, "$ROSE_SECRET"))
        self.observer_path = self.run_dir / "observer.key"  # what a dashboard gets: it can watch, nothing else
        write_observer_key(self.observer_path, self.secret)
        self.children = self._children()
        self.controller: Controller | None = None
        self.loop: ControlLoop | None = None
        """The controller's one loop: its watchdog checks the executors' processes (``watch_executors``)."""
        self.publisher: WeightPublisher | None = None
        self.relays: dict[str, WeightRelay] = {}
        """cluster name -> the relay `rose run` started for it."""
        self.load: LoadGenerator | None = None

    def start(self) -> tuple[Controller, WeightPublisher]:
        from rose_core.app.rl.demo.model_dirs import resolve_models

        cfg = self.config
        models = resolve_models(cfg)
        self.say(f"models: policy {models.policy}, serving {models.serving}")
        self.controller = Controller(cfg, self.secret)
        self.loop = ControlLoop(self.controller)
        metrics_url = serve_metrics(cfg.controller.host, cfg.controller.metrics_port)
        self.publisher = load_publisher(cfg.weight_publisher, secret=weights_key(self.secret), host=cfg.controller.host,
                                        port=cfg.controller.weights_port, tls=cfg.controller.weights_tls)
        self.controller.relays = self._start_relays(self.publisher)
        self.say(f"controller {self.controller.address}  metrics {metrics_url}  weights {self.publisher.source}")
        encrypt = " --encrypt" if cfg.controller.encrypt else ""
        self.say(f"dashboard: rose-tui --connect {self.controller.address} --secret-file {self.observer_path}{encrypt}")
        if self.spawn:
            self._start_executors(models.policy, models.serving)
        else:
            self._await_executors()
        return self.controller, self.publisher

    def _start_relays(self, publisher: WeightPublisher) -> dict[str, str]:
        """One relay per cluster that asks for one; returns executor id -> the relay it pulls through."""
        relay_of: dict[str, str] = {}
        for cluster in self.config.clusters:
            source = cluster.relay
            if cluster.relay == RELAY_START:
                relay = self.relays[cluster.name] = publisher.start_relay(
                    f"relay-{cluster.name}", transport=cluster.transport
                )
                source = relay.source
            if source != RELAY_NONE:
                relay_of.update(dict.fromkeys(cluster.executors, source))
                self.say(f"cluster {cluster.name}: {', '.join(cluster.executors)} pull weights through {source}")
        return relay_of

    def _await_executors(self) -> None:
        ex = self.config.executors
        wanted = ex.dedicated + ex.serving
        self.say(f"waiting for {wanted} executors: rose-executor --controller {self._control().address} "
                 "--executor-id ID --secret-file executor-ID.key ... (rose executor-key ID writes its key)")
        self._wait_for_executors(wanted)

    def _control(self) -> Controller:
        if self.controller is None:
            raise RuntimeError("the controller is not started yet")
        return self.controller

    def control_loop(self) -> ControlLoop:
        if self.loop is None:
            raise RuntimeError("the controller is not started yet")
        return self.loop

    def _wait_for_executors(self, count: int, alive: Callable[[], None] | None = None) -> None:
        """Run the loop until ``count`` executors registered (``alive`` may raise if a child process died), then
        watch the executors for the job."""
        controller, loop, timeout = self._control(), self.control_loop(), self.config.executors.start_timeout_s
        loop.watchdogs = [alive] if alive is not None else []
        loop.result(controller.registered(count), timeout, lambda: TimeoutError(
            f"only {len(controller.executors)} of {count} executors registered in {timeout:.0f}s"))
        loop.watchdogs = [self.watch_executors]

    def _children(self) -> ChildProcesses | RayExecutors:
        """Local processes, or actors of the Ray cluster ``[ray] address`` names (`rose run --ray`)."""
        if not self.config.ray.address:
            return ChildProcesses(self.run_dir / "logs")
        from rose_core.app.run.ray_executors import RayExecutors

        return RayExecutors(self.config.ray, self.run_dir / "logs")

    def _start_executors(self, policy: Path, serving: Path) -> None:
        controller = self._control()
        ex = self.config.executors
        roles = [("dedicated", i) for i in range(ex.dedicated)] + [("serving", i) for i in range(ex.serving)]
        for role, i in roles:
            executor_id = f"{role}-{i}"
            path = self.run_dir / f"executor-{executor_id}.toml"
            path.write_text(tomli_w.dumps(executor_config(self.config, role, policy, serving, i)))
            key_path = self.run_dir / f"executor-{executor_id}.key"  # its own key, not the secret
            write_executor_key(key_path, self.secret, executor_id)
            argv = [sys.executable, "-m", "rose_executor", "--controller", controller.address, "--role", role,
                    "--config", str(path), "--executor-id", executor_id, "--secret-file", str(key_path),
                    "--metrics-port", "0", "--log-level", executor_log_level(), "--parent-pid"]
            if isinstance(self.children, ChildProcesses):
                self.children.start(f"executor-{executor_id}", [*argv, str(os.getpid())])
            else:  # its config and its key travel to the actor through Ray; it watches its actor's pid
                files = {str(path): path.read_bytes(), str(key_path): key_path.read_bytes()}
                self.children.start(f"executor-{executor_id}", [*argv, PARENT_PID], role=role, files=files)
        where = f"Ray actors on {self.config.ray.address}" if self.config.ray.address else "vLLM CPU engines"
        self.say(f"starting {len(roles)} executors ({where}; logs in {self.children.log_dir})")
        t0 = time.monotonic()
        self._wait_for_executors(len(roles), alive=self.children.check_alive)
        self.say(f"executors ready in {time.monotonic() - t0:.0f}s: " + ", ".join(
            f"{r.executor_id} ({r.role})" for r in controller.executors.values()))

    def watch_executors(self) -> None:
        """The job's watchdog: an executor whose process exited is taken out of the job (its turns re-routed)
        and the job goes on on the rest; with none left, one error naming the last one."""
        controller = self._control()
        for child, code in self.children.newly_exited():
            executor_id = child.name.removeprefix("executor-")
            why = f"its process exited with code {code}: {child.last_lines() or 'no output'} (log: {child.log_path})"
            self.say(f"executor {executor_id} is gone ({why}); the job goes on without it")
            controller.retire(executor_id, f"process exited with code {code}")
            if not controller.executors:
                raise RoseError(f"every executor is gone; the last, {executor_id}: {why}")

    def start_load(self) -> LoadGenerator | None:
        serving = sorted((r for r in self._control().executors.values() if r.info.serving_endpoint),
                         key=lambda r: r.executor_id)
        if not self.config.load.enabled or not serving:
            return None
        self.load = LoadGenerator([r.info.serving_endpoint for r in serving], self.config.load)
        self.load.start()
        spread = ", ".join(f"{r.executor_id} {share / sum(self.load.shares):.0%}"
                           for r, share in zip(serving, self.load.shares, strict=True))
        self.say(f"production traffic -> {spread} (bursty, {self.config.load.base_rps}-"
                 f"{self.config.load.burst_rps} req/s)")
        return self.load

    def stop(self) -> None:
        if self.load is not None:
            self.load.stop()
        if self.controller is not None:
            self.controller.finished = True
            self.controller.publish_status(time.monotonic())
            try:
                loop = self.control_loop()
                loop.watchdogs = []
                loop.wait(self.controller.shutdown_executors("run finished"), time.monotonic() + 30)
            finally:
                self.children.stop_all()
                self.controller.close()
        else:
            self.children.stop_all()
        for relay in self.relays.values():
            relay.close()
        if self.publisher is not None:
            self.publisher.close()


def run(config: RunConfig, say: Say, progress: Callable[[StepStatus], None] | None = None,
        on_step: Callable[[StepReport], None] | None = None, *, spawn: bool = True,
        secret_file: str | None = None, resume: Path | None = None) -> RunReport:
    """Run the job; always returns a report (with ``error`` set if it stopped early).

    ``spawn=True`` (``rose run``) starts the executors here; ``spawn=False`` (``rose controller``) waits for
    executors started on their own hosts with the same shared secret. ``resume``: a checkpoint folder (or a
    directory of them, the newest is taken) to continue from: the run goes on with the step after it, up to
    ``rl.steps``.
    """
    if resume is not None and config.rl.trainer == EXTERNAL_TRAINER:
        raise RoseError("--resume restores ROSE's trainer: an external trainer resumes itself (start the run "
                        "without --resume; its executors get the weights your trainer publishes first)")
    if resume is not None:
        resume_point(resume, config.rl.steps)  # a bad path fails before anything starts
    require_extras(need_executor=spawn)
    if config.ray.address and importlib.util.find_spec("ray") is None:
        raise MissingExtraError("Ray (`--ray`: executors as Ray actors)", "rose-core[ray]")
    report = RunReport(slo_ttft_ms=config.slo.ttft_ms, slo_tpot_ms=config.slo.tpot_ms)
    launch = Launch(config, say, secret_file, spawn)
    job: RLJob | None = None
    with signals_as_interrupt():
        try:
            controller, publisher = launch.start()
            load = launch.start_load()
            job = _make_job(config, controller, publisher, load, launch, progress, say)
            first = 1
            if resume is not None:
                first = job.resume(resume) + 1
                say(f"resumed from {resume}: step {first - 1} done, weight version {job.version}")
            freeze_startup_heap()
            for step in range(first, config.rl.steps + 1):
                step_report = job.run_step(step)
                report.add(step_report)
                if on_step is not None:
                    on_step(step_report)
            _finish(report, controller, load, config)
        except KeyboardInterrupt:
            report.error = "interrupted"
            say("interrupted: stopping every process")
        except (RoseError, TimeoutError, RuntimeError) as exc:
            report.error = str(exc)
            raise
        finally:
            if job is not None:
                job.close()
            launch.stop()
    return report


def resume_point(path: Path, steps: int) -> int:
    """The step a checkpoint was taken after; a ``CheckpointError`` naming the fix when there is none to
    resume, or when it already holds every one of ``steps``."""
    from rose_core.app.rl.trainer.checkpoint_dir import CheckpointError, read_state, resolve

    state = read_state(resolve(path), verify=False)
    if state.step >= steps:
        raise CheckpointError(f"the checkpoint at {path} is after step {state.step}, and the run has {steps} steps: "
                              f"pass --steps above {state.step} to train on")
    return state.step


def _make_job(config: RunConfig, controller: Controller, publisher: WeightPublisher, load: LoadGenerator | None,
              launch: Launch, progress: Callable[[StepStatus], None] | None, say: Say) -> RLJob:
    from rose_core.app.rl.demo.model_dirs import resolve_models
    from rose_core.app.rl.demo.models import load_tokenizer
    from rose_core.app.rl.trainer.trainer import PolicyTrainer

    models = resolve_models(config)
    rl = config.rl
    from rose_core.app.jobs.gateway_job import GatewayJob, gateway_key

    external = rl.trainer == EXTERNAL_TRAINER
    key, key_path = gateway_key(config) if external or rl.env == GATEWAY_ENV else ("", Path())
    trainer = (ExternalTrainer(rl.trainer_ranks, wake=controller.wake) if external
               else PolicyTrainer.from_config(models.policy, rl))
    args = (controller, config, load_tokenizer(models.policy), trainer, publisher, load)
    options: dict[str, Any] = {"loop": launch.control_loop(), "on_progress": progress, "relays": launch.relays}
    if rl.env == GATEWAY_ENV:
        job: RLJob = GatewayJob(*args, policy_dir=models.policy, key=key, **options)
        say(f"gateway {job.server.url} key-file {key_path}")  # type: ignore[attr-defined]
        say(f"waiting for {rl.prompts_per_step} groups of {rl.group_size} sessions per step (docs/gateway.md)")
    else:
        job = RLJob(*args, **options)
    if isinstance(trainer, ExternalTrainer):
        _open_trainer_api(job, trainer, publisher, key, config, say, intake_key=launch.secret)
        say(f"trainer-api {job.trainer_api.url} key-file {key_path} intake {trainer.intake} "  # type: ignore[attr-defined]
            f"ranks {trainer.ranks}")
    return job


def _open_trainer_api(job: RLJob, trainer: ExternalTrainer, publisher: WeightPublisher, key: str,
                      config: RunConfig, say: Say, *, intake_key: bytes) -> None:
    """The external trainer's doors: the shard intake it publishes through (its ranks sign with the secret,
    ``intake_key``, which executors do not hold), and the API it pulls batches from."""
    from rose_core.app.gateway.http_server import ApiServer
    from rose_core.app.jobs.external_trainer import TRAINER_ROUTES

    trainer.intake = publisher.open_shard_intake(trainer.ranks, timeout=config.rl.trainer_timeout_s,
                                                 on_publish=trainer.published, key=intake_key)
    server = ApiServer(trainer, TRAINER_ROUTES, key, config.gateway.host, 0, name="rose-trainer-api").start()
    job.trainer_api = server  # type: ignore[attr-defined]
    job.closers.append(server.close)


def executor_entry(controller: Controller, rec: ExecutorRecord) -> dict[str, Any]:
    """One executor in the report: what it did, and its co-serving figures from its last heartbeat."""
    status, load = controller.snapshot_of(rec.executor_id), rec.load
    return {
        "executor_id": rec.executor_id, "role": rec.role, "weight_version": rec.weight_version,
        "turns_done": rec.turns_done, "borrowed": status.borrowed, "revoked": rec.revoked,
        "routed": status.routed, "memory_budget_bytes": load.rollout_budget_bytes,
        "emergency_cuts": load.emergency_cuts_total, "aborted_turns": load.rollout_aborted_total,
        "prefix_hit_ratio": load.prefix_hit_ratio, "guard_hold_seconds": load.guard_hold_seconds_total,
        "guard_min_slack_ms": load.guard_min_slack_ms, "cancelled_turns": load.rollout_cancelled_total,
        "cancelled_still_running": load.cancelled_still_running,
    }


def _finish(report: RunReport, controller: Controller, load: LoadGenerator | None, config: RunConfig) -> None:
    report.late_results = controller.stats.late_results
    report.retired_executors = dict(controller.stats.retired)
    report.executors = [executor_entry(controller, r) for r in controller.executors.values()]
    report.borrowing = list(controller.borrowing.events)
    if load is not None:
        whole = load.window(0.0, float("inf"), config.slo.ttft_ms, config.slo.tpot_ms)
        report.serving_requests = whole.requests
        report.serving_failed_requests = whole.failed
        report.serving_slo_violations = whole.slo_violations
