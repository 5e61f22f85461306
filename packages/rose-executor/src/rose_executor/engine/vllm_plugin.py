"""ROSE's vLLM general plugin (entry point ``vllm.general_plugins`` -> ``register``): vLLM runs it in every
process it starts (engine core, workers), which no other ROSE code reaches.

What it does: bounds vLLM's lost-wakeup stall. vLLM's shared-memory message queue (engine core <-> workers)
wakes an idle reader with a ZMQ PUB/SUB ping that can be dropped silently (``SNDHWM=1``); the reader then
finds the message only at its next recheck of shared memory, every ``SHM_READER_RECHECK_INTERVAL_MS``
(5 s in vLLM 0.32; vllm-project/vllm#45224). A reader goes idle after one second without messages, so
the first call after a pause (a weight update after the trainer's step) stalled 0-5 s at random in
``rose run``. The plugin lowers the recheck to ``ROSE_VLLM_SHM_RECHECK_MS`` (default 10 ms; ``0`` leaves
vLLM's value): an idle reader then checks one flag 100 times a second. vLLM's ``VLLM_PLUGINS``
allow-list can switch the plugin off for other vLLM processes on the host.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)
RECHECK_ENV = "ROSE_VLLM_SHM_RECHECK_MS"
DEFAULT_RECHECK_MS = 10


def register() -> None:
    """Lower vLLM's idle-reader recheck interval in this process (idempotent)."""
    wanted = _wanted_ms()
    if wanted <= 0:
        return
    from vllm.distributed.device_communicators import shm_broadcast

    current = getattr(shm_broadcast, "SHM_READER_RECHECK_INTERVAL_MS", None)
    if not isinstance(current, int):
        log.warning("vLLM has no SHM_READER_RECHECK_INTERVAL_MS any more; ROSE's lost-wakeup bound is off")
        return
    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = min(current, wanted)


def _wanted_ms() -> int:
    raw = os.environ.get(RECHECK_ENV, "")
    try:
        return int(raw) if raw else DEFAULT_RECHECK_MS
    except ValueError:
        log.warning("%s=%r is not a whole number of milliseconds; using %d", RECHECK_ENV, raw, DEFAULT_RECHECK_MS)
        return DEFAULT_RECHECK_MS
