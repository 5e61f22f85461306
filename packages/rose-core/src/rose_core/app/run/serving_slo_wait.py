"""Before `rose run`'s first step: each serving executor measures its SLO on the production it serves alone
(``[slo] from_alone``; nothing is lent, and nothing of the job runs, meanwhile), and the run prints it: the
numbers its guard keeps and the report judges by."""

from __future__ import annotations

import time

from rose_core.app.controller.control_loop import ControlLoop
from rose_core.app.controller.controller import Controller
from rose_core.app.jobs.host_slo import HostSlo, host_slos, measuring
from rose_core.app.run.launch import Say

PROGRESS_S = 10.0


def wait_for_serving_slo(loop: ControlLoop, controller: Controller, requests: int, timeout_s: float,
                         say: Say) -> dict[str, HostSlo]:
    """Run the controller's loop until every serving executor reports its SLO, or ``timeout_s`` (then the job
    starts anyway: a host still measuring lends nothing until it has, and the run says which)."""
    say(f"measuring each serving host's SLO on production served alone ({requests} requests each)")
    started = last = time.monotonic()
    while measuring(controller.executors.values()) and time.monotonic() - started < timeout_s:
        loop.turn()
        if time.monotonic() - last >= PROGRESS_S:
            last = time.monotonic()
            say("  " + "; ".join(f"{eid}: {basis or 'no heartbeat yet'}"
                                 for eid, basis in measuring(controller.executors.values()).items()))
    slos = host_slos(controller.executors.values())
    for eid, slo in sorted(slos.items()):
        say(f"serving SLO of {eid}: {slo.describe()}; its guard keeps it, this report judges by it")
    for eid, basis in sorted(measuring(controller.executors.values()).items()):
        say(f"serving SLO of {eid}: not measured after {timeout_s:.0f} s ({basis}); it lends nothing until it is "
            "(more production traffic, or a lower [slo] calibration_requests)")
    return slos
