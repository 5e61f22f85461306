"""Everything `rose run` and `rose controller` start beside the controller, and stop in order: the controller
and its loop, the metrics endpoint, the weight publisher and the clusters' relays, the executors (local
processes, or Ray actors) with their config and key files, the production traffic."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rose_core.app.config import RELAY_NONE, RELAY_START, RunConfig
from rose_core.app.controller.control_loop import ControlLoop
from rose_core.app.controller.controller import Controller
from rose_core.app.run.child_processes import PARENT_PID, ChildProcesses
from rose_core.app.run.core_split import CoreSplit, core_split, pin_process
from rose_core.app.run.executor_files import executor_config, write_executor_config
from rose_core.app.run.load_generator import LoadGenerator
from rose_core.app.weight_publisher import WeightPublisher, WeightRelay, load_publisher
from rose_core.protocol.auth import (
    SECRET_FILE_ENV,
    load_secret,
    weights_key,
    write_executor_key,
    write_new_secret,
    write_observer_key,
)
from rose_core.support.errors import RoseError
from rose_core.support.metrics import serve_metrics

if TYPE_CHECKING:
    from rose_core.app.run.ray_executors import RayExecutors


log = logging.getLogger(__name__)
Say = Callable[[str], None]


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
        self._affinity: tuple[int, ...] = ()
        """The cores this process could use before the split pinned it (given back by ``stop``)."""

    def start(self) -> tuple[Controller, WeightPublisher]:
        from rose_core.app.rl.demo.model_dirs import resolve_models

        cfg = self.config
        models = resolve_models(cfg)
        self.say(f"models: policy {models.policy}, serving {models.serving}")
        self.controller = Controller(cfg, self.secret, policy_model_dir=str(models.policy))
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
        split = self._split_cores()
        for role, i in roles:
            executor_id = f"{role}-{i}"
            path = self.run_dir / f"executor-{executor_id}.toml"
            write_executor_config(path, executor_config(self.config, role, policy, serving))
            key_path = self.run_dir / f"executor-{executor_id}.key"  # its own key, not the secret
            write_executor_key(key_path, self.secret, executor_id)
            argv = [sys.executable, "-m", "rose_executor", "--controller", controller.address, "--role", role,
                    "--config", str(path), "--executor-id", executor_id, "--secret-file", str(key_path),
                    "--metrics-port", "0", "--log-level", executor_log_level(), "--parent-pid"]
            if isinstance(self.children, ChildProcesses):
                self.children.start(f"executor-{executor_id}", [*argv, str(os.getpid())],
                                    env=split.env_of(role) if split else None,
                                    cores=split.cores_of(role) if split else ())
            else:  # its config and its key travel to the actor through Ray; it watches its actor's pid
                files = {str(path): path.read_bytes(), str(key_path): key_path.read_bytes()}
                self.children.start(f"executor-{executor_id}", [*argv, PARENT_PID], role=role, files=files)
        where = f"Ray actors on {self.config.ray.address}" if self.config.ray.address else "vLLM CPU engines"
        self.say(f"starting {len(roles)} executors ({where}; logs in {self.children.log_dir})")
        t0 = time.monotonic()
        self._wait_for_executors(len(roles), alive=self.children.check_alive)
        self.say(f"executors ready in {time.monotonic() - t0:.0f}s: " + ", ".join(
            f"{r.executor_id} ({r.role})" for r in controller.executors.values()))

    def _split_cores(self) -> CoreSplit | None:
        """Local executors only (Ray places its actors): pin this process (controller, trainer, load generator)
        to the job's side now, before the trainer starts its threads; the executors are pinned as they start."""
        ex = self.config.executors
        if self.config.ray.address or not ex.serving:
            return None
        split = core_split(ex.serving_cores)
        if split is None:
            self.say("cores: every process shares every core ([executors] serving_cores); borrowing a serving "
                     "host adds no capacity here")
            return None
        self._affinity = tuple(sorted(os.sched_getaffinity(0)))
        pin_process(os.getpid(), split.job)
        self.say(split.describe())
        return split

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
                ending = (self.controller.shutdown_executors if self.spawn else self.controller.release_executors)
                loop.wait(ending("run finished"), time.monotonic() + 30)  # a fleet's serving hosts go on serving
            finally:
                self.children.stop_all()
                self.controller.close()
        else:
            self.children.stop_all()
        for relay in self.relays.values():
            relay.close()
        if self.publisher is not None:
            self.publisher.close()
        if self._affinity:  # the process as it was: a next run in it (`rose bench e2e`) splits the same cores
            pin_process(os.getpid(), self._affinity)
