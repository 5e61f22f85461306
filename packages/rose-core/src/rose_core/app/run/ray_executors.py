"""Executors as Ray actors (`rose run --ray ADDRESS`): the one module that imports ray.

Each executor is one actor, placed by resources: a dedicated executor asks for ``dedicated_cpus`` /
``dedicated_gpus``, a serving executor for one unit of ``serving_resource`` (the operator puts one per serving
GPU on serving nodes), so Ray's own accounting lets at most one RL job borrow each serving GPU: a second job's
serving actor stays pending, and after ``placement_timeout_s`` the run stops with an error that names the
resource and the job that holds it. The actor starts `rose-executor` as its child process on its node (the
engine keeps its own process tree, as in a local run) and its files (the executor config, its own key) travel
to it through Ray as bytes, written into a private directory there; the executor watches the actor's pid, so
an actor that dies takes its executor with it. Ray places and supervises; control and weights travel over
ROSE's own channels.

``RayExecutors`` has the interface of ``ChildProcesses`` (start, newly_exited, check_alive, stop_all), so
`rose run` watches actors exactly as it watches local processes: one that dies is an executor gone (its turns
re-routed, the job goes on).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from rose_core.app.config import RayConfig
from rose_core.app.run.child_processes import PARENT_PID
from rose_core.protocol.auth import write_private
from rose_core.support.errors import RoseError

log = logging.getLogger(__name__)
ACTOR_PREFIX = "rose-"


@ray.remote(max_restarts=0, max_concurrency=4)  # type: ignore[call-overload]  # (stubs lack max_concurrency)
class ExecutorActor:
    """Runs one `rose-executor` process on the node Ray placed it on, until it exits or is stopped."""

    def __init__(self, argv: list[str], files: dict[str, bytes], log_path: str) -> None:
        self._dir = tempfile.mkdtemp(prefix="rose-executor-")  # 0700: its key is written here
        local = {}
        for key, data in files.items():
            path = Path(self._dir, Path(key).name)
            write_private(path, data)
            local[key] = str(path)
        argv = [str(os.getpid()) if arg == PARENT_PID else local.get(arg, arg) for arg in argv]
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        self._log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - open for the child's whole life
        self._proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)

    def ready(self) -> dict[str, Any]:
        return {"pid": self._proc.pid, "node": ray.get_runtime_context().get_node_id()}

    def wait(self) -> int:
        """The executor's exit code, once it exits."""
        return self._proc.wait()

    def stop(self, grace_s: float) -> int:
        """SIGTERM the executor's process group, SIGKILL it after ``grace_s``; its exit code."""
        self._signal(signal.SIGTERM)
        try:
            return self._proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            return self._proc.wait(timeout=10)

    def log_tail(self, n: int) -> str:
        try:
            lines = Path(self._log_path).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join([ln for ln in lines if ln.strip()][-n:])

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)


@dataclass(slots=True)
class RayChild:
    """One executor actor, as ``rose run``'s watchdog sees a child."""

    name: str
    actor: Any
    done: Any
    """The actor's ``wait()``: ready when the executor exited (or the actor died)."""
    ready: Any
    log_path: Path
    resources: dict[str, float]
    started: float
    placed: bool = False
    reported: bool = False
    code: int | None = field(default=None)

    def last_lines(self, n: int = 3) -> str:
        with contextlib.suppress(RayActorError, GetTimeoutError):
            return str(ray.get(self.actor.log_tail.remote(n), timeout=5))
        try:  # the actor is gone: its log, where this host can read it
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join([ln for ln in lines if ln.strip()][-n:])


class RayExecutors:
    """Executor actors of one job on a Ray cluster (the interface of ``ChildProcesses``)."""

    def __init__(self, config: RayConfig, log_dir: Path) -> None:
        self.config = config
        self.log_dir = log_dir
        self.job = secrets.token_hex(3)
        """This job's id in the actors' names (``rose-<job>-<executor>``): two jobs never clash."""
        self.children: list[RayChild] = []
        _require_reachable(config.address)
        try:
            ray.init(address=config.address, namespace=config.namespace, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RoseError(f"cannot join the Ray cluster at {config.address!r} ({exc}): start one with "
                            "`ray start --head` or pass its head's HOST:PORT to --ray") from exc

    def actor_name(self, name: str) -> str:
        return f"{ACTOR_PREFIX}{self.job}-{name}"

    def resources_for(self, role: str) -> dict[str, float]:
        cfg = self.config
        if role == "serving":
            return {"CPU": 0.0, cfg.serving_resource: 1.0}
        return {"CPU": cfg.dedicated_cpus, "GPU": cfg.dedicated_gpus}

    def start(self, name: str, argv: list[str], *, role: str, files: dict[str, bytes]) -> RayChild:
        """An actor running ``argv`` (its ``files`` keys replaced by where the actor wrote them, ``PARENT_PID``
        by the actor's pid), with ``role``'s resources."""
        want = self.resources_for(role)
        options: dict[str, Any] = {"name": self.actor_name(name), "num_cpus": want.pop("CPU"),
                                   "num_gpus": want.pop("GPU", 0.0), "resources": want}
        log_path = self.log_dir / f"{name}.log"
        actor = ExecutorActor.options(**options).remote(argv, files, str(log_path))  # type: ignore[attr-defined]
        child = RayChild(name, actor, actor.wait.remote(), actor.ready.remote(), log_path,
                         self.resources_for(role), time.monotonic())
        self.children.append(child)
        log.info("%s: Ray actor %s asks for %s", name, options["name"], child.resources)
        return child

    def newly_exited(self) -> list[tuple[RayChild, int]]:
        """Executors whose process exited or whose actor died since the last call (each reported once);
        a dead actor's code is -9."""
        out = []
        for child in self.children:
            if child.reported or not _done(child.done):
                continue
            child.reported = True
            child.code = _exit_code(child.done)
            out.append((child, child.code))
        return out

    def check_alive(self) -> None:
        """Raise a one-line error naming the first executor that exited, or that waited for its resources
        longer than ``placement_timeout_s``."""
        for child in self.children:
            if _done(child.done):
                code = _exit_code(child.done)
                raise RoseError(f"{child.name} exited with code {code}: {child.last_lines() or 'no output'} "
                                f"(log: {child.log_path})")
            if not child.placed:
                child.placed = _done(child.ready)
            if not child.placed and time.monotonic() - child.started > self.config.placement_timeout_s:
                raise RoseError(self._unplaced(child))

    def stop_all(self, grace_s: float = 20.0) -> None:
        """Stop every executor (SIGTERM, then SIGKILL after ``grace_s``), then its actor; leave the cluster."""
        stops = [child.actor.stop.remote(grace_s) for child in self.children if child.placed or _done(child.ready)]
        deadline = time.monotonic() + grace_s + 15
        for stop in stops:  # one by one: a dead actor's error must not cut short the others' grace
            with contextlib.suppress(RayActorError, GetTimeoutError):
                ray.get(stop, timeout=max(0.0, deadline - time.monotonic()))
        for child in self.children:
            with contextlib.suppress(RayActorError, ValueError):
                ray.kill(child.actor)
        ray.shutdown()

    def _unplaced(self, child: RayChild) -> str:
        wanted = ", ".join(f"{k}: {v:g}" for k, v in child.resources.items() if v)
        serving = self.config.serving_resource
        holders = sorted({name.split("-")[1] for name in _named_actors(self.config.namespace)
                          if name.startswith(ACTOR_PREFIX) and "-serving-" in name and
                          not name.startswith(self.actor_name(""))})
        held = f"; RL jobs holding {serving} now: {', '.join(holders)}" if holders and serving in child.resources else ""
        return (f"{child.name} waited {self.config.placement_timeout_s:g} s for Ray resources ({wanted}) "
                f"and none were free: each serving GPU lends itself to one RL job at a time{held}. Wait for that "
                f"job to end, add {serving} to more nodes, or run fewer executors ([executors])")


def _require_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``HOST:PORT`` where nothing listens is one clear error now (``ray.init`` would wait minutes for it)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # ``auto`` and other forms: Ray resolves them
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RoseError(f"no Ray cluster answers at {address} ({exc}): start one there with "
                        f"`ray start --head --port {port}`, or pass the head's HOST:PORT to --ray") from exc


def _done(ref: Any) -> bool:
    ready, _ = ray.wait([ref], timeout=0)
    return bool(ready)


def _exit_code(ref: Any) -> int:
    try:
        return int(ray.get(ref, timeout=5))
    except (RayActorError, GetTimeoutError):
        return -signal.SIGKILL


def _named_actors(namespace: str) -> list[str]:
    with contextlib.suppress(Exception):  # best effort: only to name the holders in an error
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace]
    return []
