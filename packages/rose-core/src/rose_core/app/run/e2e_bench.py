"""`rose bench e2e`: the paper's end-to-end claim on real engines, in one invocation.

1. ``alone``: the serving host with production traffic and no job (``Launch`` with one serving executor and
   the load generator): it measures its SLO on the production it serves alone (``[slo] from_alone``, the
   ``--slo-multiple``), then serves ``alone_s`` seconds more, judged by that SLO. That SLO is the invocation's.
2. Each system of ``e2e_systems.SYSTEMS``: the same job as a whole `rose run` (its own controller, executors
   and traffic: the same seeded trace), the serving hosts on their own cores, judged by the invocation's SLO.

Everything runs through the product's own path (``Launch``, ``rose_run.run``); nothing is timed but the steps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec

from rose_core.app.config import RunConfig
from rose_core.app.jobs.host_slo import HostSlo, judged, judged_since
from rose_core.app.jobs.step_report import StepReport
from rose_core.app.run.core_split import core_split
from rose_core.app.run.e2e_systems import SYSTEMS, figures, ratios, system_config
from rose_core.app.run.launch import Launch, Say
from rose_core.app.run.rose_run import SLO_WAIT_S, run
from rose_core.app.run.serving_slo_wait import wait_for_serving_slo
from rose_core.support.errors import RoseError


def bench_e2e(base: RunConfig, *, steps: int, systems: Sequence[str] = SYSTEMS, slo_multiple: float = 1.5,
              alone_s: float = 30.0, say: Say) -> dict[str, Any]:
    """The JSON of `rose bench e2e --json`: the SLO, ``{"systems": {NAME: figures}}`` with ``alone`` first, and
    the ratios of ``rose`` to the fixed systems."""
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise RoseError(f"unknown system {', '.join(unknown)}: choose from {', '.join(SYSTEMS)}")
    root = Path(base.run_dir)
    slo, alone = measure_alone(base, slo_multiple, alone_s, str(root / "alone"), say)
    split = core_split(base.executors.serving_cores)
    out: dict[str, Any] = {"slo": asdict(slo), "slo_multiple": slo_multiple, "steps": steps,
                           "cores": split.describe() if split else "shared", "systems": {"alone": alone}}
    for system in systems:
        say(f"--- {system}: {steps} steps")
        config = system_config(base, system, slo, steps, str(root / system))
        step_ends: list[float] = []

        def on_step(_: StepReport, ends: list[float] = step_ends) -> None:
            ends.append(time.monotonic())

        report = run(config, say, on_step=on_step)
        if report.error == "interrupted":
            raise KeyboardInterrupt
        out["systems"][system] = figures(report, step_ends)
        say(f"{system}: {summary_line(out['systems'][system])}")
    out["ratios"] = ratios(out["systems"])
    return out


def measure_alone(base: RunConfig, multiple: float, seconds: float, run_dir: str,
                  say: Say) -> tuple[HostSlo, dict[str, Any]]:
    """The serving host alone: its SLO measured (``multiple`` x the p99 of production served alone), then
    ``seconds`` more of the same traffic judged by it."""
    config = msgspec.convert(msgspec.to_builtins(base), RunConfig)
    config.run_dir, config.executors.dedicated, config.executors.serving = run_dir, 0, 1
    config.slo.from_alone = multiple
    config = msgspec.convert(msgspec.to_builtins(config), RunConfig)
    say(f"--- alone: the serving host, production only, {seconds:g} s after its SLO is measured")
    launch = Launch(config, say, None, True)
    try:
        controller, _ = launch.start()
        load = launch.start_load()
        if load is None:
            raise RoseError("`rose bench e2e` needs production traffic: set [load] enabled = true")
        loop = launch.control_loop()
        slos = wait_for_serving_slo(loop, controller, config.slo.calibration_requests, SLO_WAIT_S, say)
        if not slos:
            raise RoseError("the serving host did not measure its SLO: more traffic ([load] base_rps), or a lower "
                            "[slo] calibration_requests")
        before, t0 = judged(controller.executors.values()), time.monotonic()
        while time.monotonic() - t0 < seconds:
            loop.turn()
        loop.turn(1.5)  # one more heartbeat: the host's counts up to the end of the window
        requests, over = judged_since(judged(controller.executors.values()), before)
        window = load.window(t0, time.monotonic(), 0.0, 0.0)
        slo = next(iter(slos.values()))
    finally:
        launch.stop()
    over += window.failed
    figures_alone = {
        "ok": True, "slo_attainment": 1 - over / requests if requests else 1.0, "slo_judged": requests,
        "slo_violations": over, "ttft_p99_ms": window.ttft_p99_ms, "tpot_p99_ms": window.tpot_p99_ms,
        "turns_serving": 0, "seconds": seconds,
    }
    say(f"alone: {summary_line(figures_alone)}")
    return slo, figures_alone


def summary_line(f: dict[str, Any]) -> str:
    parts = [f"SLO attainment {f['slo_attainment']:.3f} ({f['slo_violations']} of {f['slo_judged']} over)",
             f"client p99 TTFT {f['ttft_p99_ms']:.0f} ms, TPOT {f['tpot_p99_ms']:.0f} ms"]
    if "samples_per_s" in f:
        parts = [f"{f['samples_per_s']:.2f} samples/s", f"rollout {f['rollout_s_per_step']:.2f} s/step "
                 f"({f['rollout_share']:.0%} of a step)", f"turns on serving {f['turns_serving']}",
                 f"reward last 5 {f['reward_last5']:+.3f}", *parts]
    return "; ".join(parts)


def format_e2e(result: dict[str, Any]) -> str:
    """The table `rose bench e2e` prints."""
    head = ["system", "samples/s", "rollout s/step", "rollout share", "turns srv", "SLO att.", "TTFT p99",
            "TPOT p99", "reward last5"]
    rows = [head]
    for name, f in result["systems"].items():
        rows.append([name, _num(f, "samples_per_s", "{:.2f}"), _num(f, "rollout_s_per_step", "{:.2f}"),
                     _num(f, "rollout_share", "{:.0%}"), str(f.get("turns_serving", 0)),
                     f"{f['slo_attainment']:.3f}", f"{f['ttft_p99_ms']:.0f} ms", f"{f['tpot_p99_ms']:.0f} ms",
                     _num(f, "reward_last5", "{:+.3f}")])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    slo = result["slo"]
    lines.append(f"SLO: TTFT <= {slo['ttft_ms']:.1f} ms, TPOT <= {slo['tpot_ms']:.1f} ms ({slo['basis']}); "
                 "TTFT/TPOT p99: the load generator's clock")
    lines += [f"{k}: {v:.2f}x samples/s" for k, v in result["ratios"].items()]
    return "\n".join(lines)


def _num(f: dict[str, Any], key: str, fmt: str) -> str:
    return fmt.format(f[key]) if key in f else "-"
