"""`rose run`: the whole system on one machine, as separate processes talking the protocol.

The launcher owns the controller (this process), the trainer and the load generator, and starts every
executor as a child process (`python -m rose_executor`). Whatever happens (an error, Ctrl-C, SIGTERM), every
child is stopped before it returns.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rose_core.app.config import GATEWAY_ENV, RunConfig
from rose_core.app.controller.controller import Controller
from rose_core.app.controller.executor_record import ExecutorRecord
from rose_core.app.gateway.http_server import ApiServer
from rose_core.app.jobs.external_trainer import ExternalTrainer
from rose_core.app.jobs.host_slo import HostSlo, host_slos, judged, judged_since
from rose_core.app.jobs.rl_job import RLJob
from rose_core.app.jobs.step_report import StepReport
from rose_core.app.run.interrupts import StopRequest, caused_by_interrupt, signals_as_interrupt
from rose_core.app.run.launch import Launch, Say
from rose_core.app.run.load_generator import LoadGenerator
from rose_core.app.run.run_report import RunReport
from rose_core.app.run.serving_slo_wait import wait_for_serving_slo
from rose_core.app.weight_publisher import WeightPublisher
from rose_core.protocol.messages import StepStatus
from rose_core.support.errors import MissingExtraError, RoseError
from rose_core.support.heap import freeze_startup_heap

log = logging.getLogger(__name__)

SLO_WAIT_S = 180.0
"""How long `rose run` waits for its serving executors to measure their SLO before the first step."""


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


def run(config: RunConfig, say: Say, progress: Callable[[StepStatus], None] | None = None,
        on_step: Callable[[StepReport], None] | None = None, *, spawn: bool = True,
        secret_file: str | None = None, resume: Path | None = None) -> RunReport:
    """Run the job; always returns a report (with ``error`` set if it stopped early).

    ``spawn=True`` (``rose run``) starts the executors here; ``spawn=False`` (``rose controller``) waits for
    executors started on their own hosts with the same shared secret. ``resume``: a checkpoint folder (or a
    directory of them, the newest is taken) to continue from: the run goes on with the step after it, up to
    ``rl.steps``.
    """
    if resume is not None and config.rl.trainer.external:
        raise RoseError("--resume restores ROSE's trainer: an external trainer resumes itself (start the run "
                        "without --resume; its executors get the weights your trainer publishes first)")
    if resume is not None:
        resume_point(resume, config.rl.steps)  # a bad path fails before anything starts
    require_extras(need_executor=spawn)
    if config.ray.address and importlib.util.find_spec("ray") is None:
        raise MissingExtraError("Ray (`--ray`: executors as Ray actors)", "rose-core[ray]")
    report = RunReport(slo_ttft_ms=config.slo.ttft_ms, slo_tpot_ms=config.slo.tpot_ms)  # the hosts' once known
    launch = Launch(config, say, secret_file, spawn)
    job: RLJob | None = None
    with signals_as_interrupt(), StopRequest().on_signal() as stop:
        try:
            controller, publisher = launch.start()
            load = launch.start_load()
            if load is not None and config.slo.from_alone > 0:
                wait_for_serving_slo(launch.control_loop(), controller, config.slo.calibration_requests,
                                     SLO_WAIT_S, say)
            job = _make_job(config, controller, publisher, load, launch, progress, say)
            first = 1
            if resume is not None:
                first = job.resume(resume) + 1
                say(f"resumed from {resume}: step {first - 1} done, weight version {job.version}")
            freeze_startup_heap()
            since = time.monotonic()
            for step in range(first, config.rl.steps + 1):
                step_report = job.run_step(step)
                stopping = stop.requested and step < config.rl.steps  # read once: checkpoint and stop agree
                if stopping:
                    step_report.checkpoint = step_report.checkpoint or job.checkpoint(step, step_report, last=True)
                report.add(step_report)
                if on_step is not None:
                    on_step(step_report)
                if stopping:
                    report.stopped_after_step = step
                    say(f"stopping after step {step} of {config.rl.steps}, as asked (SIGUSR1)")
                    break
            _finish(report, controller, load, config, since)
        except BaseException as exc:
            if not (isinstance(exc, KeyboardInterrupt) or caused_by_interrupt(exc)):
                if isinstance(exc, RoseError | TimeoutError | RuntimeError):
                    report.error = str(exc)
                raise
            report.error = "interrupted"
            say("interrupted: stopping every process")
        finally:
            if job is not None:
                job.close()
            launch.stop()
    return report


def client_over(load: LoadGenerator, slo_of: dict[str, HostSlo], since: float) -> int:
    """Production requests that arrived from ``since`` over their host's SLO as the load generator's own clock
    saw them (failures too)."""
    over = 0
    for sample in load.samples():
        if sample.arrived < since:
            continue
        slo = slo_of.get(load.endpoints[sample.endpoint])
        if slo is not None and (not sample.ok or sample.ttft_s * 1e3 > slo.ttft_ms or sample.tpot_s * 1e3 > slo.tpot_ms):
            over += 1
    return over


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
    from rose_core.app.jobs.gateway_job import GatewayJob, gateway_key, trainer_key

    external = rl.trainer.external
    key, key_path = gateway_key(config) if rl.env == GATEWAY_ENV else ("", Path())
    trainer = (ExternalTrainer(rl.trainer.ranks, wake=controller.wake) if external
               else PolicyTrainer.from_config(models.policy, rl))
    args = (controller, config, load_tokenizer(models.policy), trainer, publisher, load)
    options: dict[str, Any] = {"loop": launch.control_loop(), "on_progress": progress, "relays": launch.relays}
    job: RLJob
    if rl.env == GATEWAY_ENV:
        job = gateway = GatewayJob(*args, policy_dir=models.policy, key=key, **options)
        say(f"gateway {gateway.server.url} key-file {key_path}")
        say(f"waiting for {rl.prompts_per_step} groups of {rl.group_size} sessions per step (docs/gateway.md)")
    else:
        job = RLJob(*args, **options)
    if isinstance(trainer, ExternalTrainer):
        trainer_secret, trainer_path = trainer_key(config)
        refused = {key: "this is the agents' gateway key: the trainer API takes the trainer's key "
                        f"({trainer_path}, rl.trainer.key_file)"} if key else {}
        api = _open_trainer_api(job, trainer, publisher, trainer_secret, config, intake_key=launch.secret,
                                refused_keys=refused)
        say(f"trainer-api {api.url} key-file {trainer_path} intake {trainer.intake} ranks {trainer.ranks}")
    return job


def _open_trainer_api(job: RLJob, trainer: ExternalTrainer, publisher: WeightPublisher, key: str,
                      config: RunConfig, *, intake_key: bytes, refused_keys: dict[str, str]) -> ApiServer:
    """The external trainer's doors: the shard intake it publishes through (its ranks sign with the secret,
    ``intake_key``, which executors do not hold), and the API it pulls batches from."""
    from rose_core.app.jobs.external_trainer import TRAINER_ROUTES

    trainer.intake = publisher.open_shard_intake(trainer.ranks, timeout=config.rl.trainer.timeout_s,
                                                 on_publish=trainer.published, key=intake_key)
    from rose_core.app.jobs.gateway_job import server_limits

    server = ApiServer(trainer, TRAINER_ROUTES, key, config.gateway.host, 0, name="rose-trainer-api",
                       limits=server_limits(config), refused_keys=refused_keys).start()
    job.closers.append(server.close)
    return server


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


def _finish(report: RunReport, controller: Controller, load: LoadGenerator | None, config: RunConfig,
            since: float) -> None:
    """``since``: when the first step started (the client-side count starts there)."""
    report.late_results = controller.stats.late_results
    report.retired_executors = dict(controller.stats.retired)
    report.left_executors = dict(controller.stats.left)
    report.executors = [executor_entry(controller, r) for r in controller.executors.values()]
    report.borrowing = list(controller.borrowing.events)
    records = list(controller.executors.values())
    slos = host_slos(records)
    report.serving_slo = {eid: asdict(slo) for eid, slo in sorted(slos.items())}
    if slos:
        first = slos[min(slos)]
        report.slo_ttft_ms, report.slo_tpot_ms = first.ttft_ms, first.tpot_ms
    report.serving_slo_judged, over = judged_since(judged(records), {})
    report.serving_slo_violations = over
    if load is not None:
        whole = load.window(0.0, float("inf"), config.slo.ttft_ms, config.slo.tpot_ms)
        report.serving_requests = whole.requests
        report.serving_failed_requests = whole.failed
        steps = load.window(since, float("inf"), config.slo.ttft_ms, config.slo.tpot_ms)
        report.serving_ttft_p99_ms, report.serving_tpot_p99_ms = steps.ttft_p99_ms, steps.tpot_p99_ms
        report.serving_slo_violations += whole.failed
        report.client_slo_violations = client_over(load, {r.info.serving_endpoint.rstrip("/"): slos[r.executor_id]
                                                          for r in records if r.executor_id in slos}, since)
