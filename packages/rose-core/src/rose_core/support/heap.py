"""The heap a process has once it has started, frozen out of the garbage collector's full passes.

What is alive when a ROSE process has started (imported modules, the models and their tokenizers, the
engines' clients, the trainer, the scheduler) lives as long as the process. CPython's full collection
(generation 2) still walks all of it every time one runs: on this host (2 vCPUs) a pass took about 200 ms
in `rose run`'s controller and 300 ms in a dedicated executor, stalling every turn in flight, the executor's
SLO guard and its heartbeats (docs/benchmarks.md, "Controller and gateway latency"). ``freeze_startup_heap``
collects once, then moves every object left to the permanent generation (``gc.freeze``): later full passes
walk only what was allocated since. vLLM does the same after its engine core starts and in its OpenAI
server's lifespan (``freeze_gc_heap``): a serving executor, which mounts that app, has its heap frozen by
it already (its log says a full pass took ~0 ms before); the controller and a dedicated executor did not.

Called once per process, when it has started and before it takes work: by `rose run` / `rose controller`
before the first step and by `rose-executor` once its engines run. A cycle of frozen objects is never
collected (reference counting still frees the rest), so it is called once, at start, not per step: what a
step allocates stays collectable.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FrozenHeap:
    objects: int
    """Objects frozen (the whole tracked heap left after one full collection)."""
    full_pass_before_s: float
    """What a full collection took over the startup heap (what each one would cost without the freeze); ~0 when
    another thread's collection was running at that moment (``gc.collect`` then returns at once)."""
    full_pass_after_s: float
    """What one takes right after the freeze."""


def freeze_startup_heap() -> FrozenHeap:
    """Collect, freeze every object left, and time a full pass before and after; logged at INFO."""
    started = time.perf_counter()
    gc.collect()
    before = time.perf_counter() - started
    gc.freeze()
    started = time.perf_counter()
    gc.collect()
    after = time.perf_counter() - started
    frozen = FrozenHeap(gc.get_freeze_count(), before, after)  # counting walks the frozen list: not timed
    log.info("froze the startup heap: %d objects out of full garbage collections (a full pass: %.2f ms before, "
             "%.2f ms after)", frozen.objects, 1e3 * frozen.full_pass_before_s, 1e3 * frozen.full_pass_after_s)
    return frozen
