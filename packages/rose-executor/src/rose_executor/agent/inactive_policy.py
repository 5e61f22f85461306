"""The pre-deployed policy of a serving host (``[rollout] keep_between_leases``): a rollout engine kept between
leases, inactive, and activated by the next job that names its policy instead of starting an engine.

Invariant: an inactive engine runs nothing (paused, every request aborted, its prefix cache dropped) and holds
either the policy's own weights (``version`` 0: nothing was ever committed to it) or none that a job may trust
(``version`` -1: its resident weights forgotten, so the next job's first version comes whole and the host runs
no turn before it). Where the device can (a GPU engine with sleep mode) its memory is released while inactive.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from rose_executor.engine.bounded_call import bounded
from rose_executor.engine.engine_protocol import Engine
from rose_executor.rollout.engine_memory import EngineMemory

log = logging.getLogger(__name__)


@dataclass(slots=True)
class InactivePolicy:
    engine: Engine
    model_dir: str
    version: int
    """0: the policy's own weights; -1: none a job may trust."""
    memory: EngineMemory


async def deactivate(engine: Engine, model_dir: str, version: int, memory: EngineMemory) -> InactivePolicy:
    """Make a lease's rollout engine the inactive policy (its turns were given back already): paused with its
    requests aborted and its cache dropped, its weights forgotten if a job changed them, its memory released
    where it can be."""
    timeout = memory.call_timeout_s
    await bounded(engine.pause(clear_cache=True), timeout, "pause")
    if version != 0:
        await bounded(engine.forget_weights(), timeout, "forget its weights")
    await memory.release()
    log.info("rollout engine for %s kept inactive%s", model_dir, " (memory released)" if memory.released else "")
    return InactivePolicy(engine, model_dir, 0 if version == 0 else -1, memory)


async def activate(policy: InactivePolicy) -> float:
    """Make the inactive policy run again (memory restored, scheduling resumed); the seconds it took."""
    started = time.perf_counter()
    await policy.memory.restore()
    await bounded(policy.engine.resume(), policy.memory.call_timeout_s, "resume")
    seconds = time.perf_counter() - started
    log.info("activated the inactive policy %s in %.2f s (weights %s)", policy.model_dir, seconds,
             "of the policy" if policy.version == 0 else "forgotten: the job's next version comes whole")
    return seconds
