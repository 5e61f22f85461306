"""The cores of one machine split between the serving hosts and the job, as `rose run` places its processes:
the serving executors (production engine, rollout engine, guard) on their own cores, and everything of the job
(this process: controller, trainer, load generator; the dedicated executors) on the rest. Without it every
process shares every core and borrowing a serving host cannot add capacity (the trainer's step would slow the
serving engine as much as the guard could ever protect it).

``[executors] serving_cores``: ``auto`` (the last half of the cores this process may use, at least one, when it
may use two or more; none otherwise), ``none``, or a CPU list such as ``"3"`` or ``"4-7,12"``. Each engine's
worker binds its threads to its side's cores through ``VLLM_CPU_OMP_THREADS_BIND``; each process is pinned
with ``sched_setaffinity``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rose_core.support.cpu_list import AUTO, NONE, cpu_list, parse_cpu_list
from rose_core.support.errors import ConfigError

CPU_BIND = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True, slots=True)
class CoreSplit:
    serving: tuple[int, ...]
    job: tuple[int, ...]

    def cores_of(self, role: str) -> tuple[int, ...]:
        return self.serving if role == "serving" else self.job

    def env_of(self, role: str) -> dict[str, str]:
        """What an executor of ``role`` starts with: its engines' threads bound to its side's cores."""
        return {CPU_BIND: cpu_list(self.cores_of(role))}

    def describe(self) -> str:
        return (f"cores: serving hosts on {cpu_list(self.serving)}; controller, trainer, load generator and "
                f"dedicated executors on {cpu_list(self.job)}")


def core_split(setting: str, allowed: set[int] | None = None) -> CoreSplit | None:
    """The split ``setting`` names over the cores this process may use (``allowed``); None: no split. A
    ``ConfigError`` naming the fix for a list that leaves the job no core or names a core it may not use."""
    cores = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    if setting == NONE or (setting == AUTO and len(cores) < 2):
        return None
    if setting == AUTO:
        half = len(cores) // 2
        return CoreSplit(serving=tuple(cores[half:]), job=tuple(cores[:half]))
    try:
        serving = parse_cpu_list(setting)
    except ValueError as exc:
        raise ConfigError(f"[executors] serving_cores: {exc}") from exc
    outside = sorted(set(serving) - set(cores))
    if outside:
        raise ConfigError(f"[executors] serving_cores = {setting!r} names cores this process may not use "
                          f"({cpu_list(tuple(outside))}; it may use {cpu_list(tuple(cores))})")
    job = tuple(c for c in cores if c not in serving)
    if not job:
        raise ConfigError(f"[executors] serving_cores = {setting!r} leaves the job no core: give the serving "
                          "hosts fewer, or write \"none\" to share every core")
    return CoreSplit(serving=serving, job=job)


def pin_process(pid: int, cores: tuple[int, ...]) -> None:
    """Pin every thread of ``pid`` (its threads started before this too) to ``cores``."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:
            continue
