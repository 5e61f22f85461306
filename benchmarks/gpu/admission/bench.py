"""The bench's run: profile the latency model, build the guard, run every scenario, summarise."""

from __future__ import annotations

import faulthandler
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from rose_core.policy import SloBudgets

from . import __doc__ as package_doc
from .config import Config, elapsed_s, log, parse
from .report import (
    clean,
    guarded_section,
    ratios,
    scenario_result,
    summary,
    targets,
    write_out,
)
from .rig import Rig
from .schedule import (
    ADMISSION_IMPL,
    BlindDuty,
    Burst,
    ChunkGuard,
    Guarded,
    LatencyProfile,
    Policy,
    Saturate,
    make_schedule,
    run_loop,
)


def profile(rig: Rig, cfg: Config) -> dict[str, Any]:
    """The latency model: serving step (CUDA events and host TPOT, back to back) and rollout chunk time."""
    n_steps = 30 if cfg.smoke else 120
    warm = [Burst(0.0, 10 if cfg.smoke else 30)]
    run_loop(rig, Policy(), warm, 1e9, 0.0, 60.0, until_idle=True)
    rec, _ = run_loop(rig, Policy(), [Burst(0.0, n_steps)], 1e9, 0.0, 120.0, until_idle=True)
    chunk_ms: list[float] = []
    for i in range(25 if cfg.smoke else 60):
        h = rig.chunk(0.0, timed=True)
        rig.sync()
        if i >= 5:
            chunk_ms.append(h.gpu_ms())
    t_start = time.perf_counter()
    reps = 5 if cfg.smoke else 200
    for _ in range(reps):
        rig.chunk(0.0)
    rig.sync()
    direct = reps * cfg.chunk_flop / (time.perf_counter() - t_start) / 1e12
    return {
        "serving_step_ms": summary(rec.tpot_step_ms + rec.first_step_ms),
        "serving_host_tpot_ms": summary(rec.host_tpot_ms),
        "rollout_chunk_ms": summary(chunk_ms),
        "rollout_alone_direct_tflops": direct,
    }


class Bench:
    """One bench run: the rig, the profiled latency model and SLO budgets, the guard, the serving schedule
    every co-location scenario replays, and the result being filled in."""

    def __init__(self, cfg: Config, rig: Rig, res: dict[str, Any]) -> None:
        self.cfg, self.rig, self.res = cfg, rig, res
        prof = res["profile"] = profile(rig, cfg)
        t_dec = prof["serving_host_tpot_ms"].get("p99", float("nan")) / 1e3
        if not math.isfinite(t_dec):
            t_dec = prof["serving_step_ms"]["p99"] / 1e3
        self.lat = LatencyProfile(t_dec, prof["serving_step_ms"]["p99"] / 1e3, prof["rollout_chunk_ms"]["p99"] / 1e3)
        self.slo = SloBudgets(self.lat.t_first + cfg.ttft_extra_chunks * self.lat.t_chunk, cfg.tpot_slo_mult * t_dec)
        self.guard = ChunkGuard.build(self.lat, self.slo, cfg.margin_ms / 1e3, cfg.chunk_tokens)
        res["admission_impl"] = ADMISSION_IMPL
        res["latency_model"] = {
            "t_dec_ms": t_dec * 1e3,
            "t_first_ms": self.lat.t_first * 1e3,
            "t_chunk_ms": self.lat.t_chunk * 1e3,
            "tpot_budget_ms": self.slo.tpot_s * 1e3,
            "ttft_budget_ms": self.slo.ttft_s * 1e3,
            "margin_ms": cfg.margin_ms,
            "guard_margin_ms": self.guard.margin_s * 1e3,
        }
        log(
            f"profile: serving step p50/p99 {prof['serving_step_ms']['p50']:.3f}/{prof['serving_step_ms']['p99']:.3f}"
            f" ms, host TPOT p99 {t_dec * 1e3:.3f} ms, chunk p50/p99 {prof['rollout_chunk_ms']['p50']:.3f}/"
            f"{self.lat.t_chunk * 1e3:.3f} ms, rollout direct {prof['rollout_alone_direct_tflops']:.1f} TFLOP/s; "
            f"admission: {ADMISSION_IMPL}, margin {self.guard.margin_s * 1e3:.3f} ms"
        )
        write_out(res)
        step_s = prof["serving_host_tpot_ms"].get("mean", prof["serving_step_ms"]["mean"]) / 1e3
        self.schedule = make_schedule(cfg.seconds, step_s, cfg.duty, cfg.burst_steps, cfg.seed)
        steps = sum(b.steps for b in self.schedule)
        busy = steps * step_s / cfg.seconds
        res["schedule"] = {"bursts": len(self.schedule), "steps": steps, "planned_busy_fraction": busy}
        self.deadline = time.perf_counter() + cfg.max_total_s
        self.hard_s = cfg.seconds * 3 + 30.0

    def run(self, name: str, policy: Policy, bursts: list[Burst], seconds: float) -> None:
        """One scenario into ``res["scenarios"][name]`` (a failure into ``res["errors"]``)."""
        if time.perf_counter() > self.deadline:
            self.res["errors"][name] = f"skipped: past --max-total-s {self.cfg.max_total_s:.0f}"
            log(f"{name}: skipped (time budget)")
            return
        with guarded_section(self.res, name):
            log(f"{name}: start ({policy.name})")
            rec, wall = run_loop(self.rig, policy, bursts, seconds, self.lat.t_chunk, self.hard_s)
            r = scenario_result(self.cfg, rec, wall, self.slo.tpot_s * 1e3)
            if isinstance(policy, Guarded):
                r["admitted_chunks"], r["green_admitted"] = policy.admitted, policy.green_admitted
                r["admitted_chunks_while_serving"] = policy.admitted_while_serving
            self.res["scenarios"][name] = r
            log(
                f"{name}: TPOT step p50/p99 {r['tpot_step_ms'].get('p50', float('nan')):.3f}/"
                f"{r['tpot_step_ms'].get('p99', float('nan')):.3f} ms, first step p99 "
                f"{r['first_step_ms'].get('p99', float('nan')):.3f} ms, rollout {r['rollout_tflops']:.1f} TFLOP/s"
            )


@dataclass(frozen=True)
class Scenario:
    name: str
    policy: Callable[[Bench], Policy]
    serving: bool = True
    """Replay the serving schedule (else: ``rollout_alone_seconds`` without serving)."""


SCENARIOS = (
    Scenario("serving_alone", lambda b: Policy()),
    Scenario("rollout_alone", lambda b: Saturate("full", 2), serving=False),
    Scenario("unmanaged", lambda b: Saturate("full", 2)),
    Scenario("blind_duty50", lambda b: BlindDuty(0.5)),
    Scenario("guarded", lambda b: Guarded(b.guard)),
)


def run_scenario(bench: Bench, sc: Scenario) -> None:
    bursts, seconds = (bench.schedule, bench.cfg.seconds) if sc.serving else ([], bench.cfg.rollout_alone_seconds)
    bench.run(sc.name, sc.policy(bench), bursts, seconds)


def green_dial(bench: Bench) -> None:
    """``guarded_green``: set up the green context, profile serving beside a saturated confined rollout, and
    run the guarded scenario with the dial (admitted against that profile); ``res["green_context"]``."""
    cfg, rig, res = bench.cfg, bench.rig, bench.res
    if not rig.cuda or cfg.green_sms <= 0:
        res["green_context"] = {"available": False, "reason": "cpu backend" if not rig.cuda else "--green-sms 0"}
        return
    with guarded_section(res, "green_setup"):
        rig.setup_green()
    green = res["green_context"] = rig.green_info
    if not green.get("available"):
        log(f"green context unavailable: {green.get('reason')}")
        return
    with guarded_section(res, "green_profile"):
        hard, t_chunk = bench.hard_s, bench.lat.t_chunk
        rec, wall = run_loop(rig, Saturate("green", 1), [], min(1.0, cfg.rollout_alone_seconds), t_chunk, hard)
        green["rollout_alone_tflops"] = rec.green_gemms * cfg.green_flop / wall / 1e12
        direct = res["profile"]["rollout_alone_direct_tflops"]
        # confined to green_sms of the device's SMs, the rollout must run far below its all-SM rate
        green["device_sms"] = torch.cuda.get_device_properties(0).multi_processor_count
        green["confinement_effective"] = green["rollout_alone_tflops"] < 0.5 * direct if direct else None
        n = 30 if cfg.smoke else 150
        rec, wall = run_loop(rig, Saturate("green", 1), [Burst(0.0, n)], 1e9, t_chunk, hard, until_idle=True)
        green["serving_step_ms"] = summary(rec.tpot_step_ms)
        green["serving_host_tpot_ms"] = summary(rec.host_tpot_ms)
        green["rollout_tflops_during_serving"] = rec.green_gemms * cfg.green_flop / wall / 1e12
        t_dec_g = green["serving_host_tpot_ms"]["p99"] / 1e3
        slo_g = SloBudgets(bench.slo.ttft_s, cfg.green_tpot_mult * bench.lat.t_dec)
        green["tpot_budget_ms"] = slo_g.tpot_s * 1e3
        green["t_dec_under_dial_ms"] = t_dec_g * 1e3
        log(
            f"green {cfg.green_sms} SMs: rollout alone {green['rollout_alone_tflops']:.1f} TFLOP/s, serving "
            f"step p99 under the dial {green['serving_step_ms'].get('p99', float('nan')):.3f} ms"
        )
        # the same guard, with the serving model profiled under the dial; the confined GEMM adds no serial
        # time (its cost is inside t_dec_g)
        lat_g = LatencyProfile(t_dec_g, bench.lat.t_first, 0.0)
        dial = ChunkGuard.build(lat_g, slo_g, cfg.margin_ms / 1e3, cfg.chunk_tokens)
        bench.run("guarded_green", Guarded(bench.guard, dial), bench.schedule, cfg.seconds)


def main(argv: list[str] | None = None, watchdog: bool = False) -> dict[str, Any]:
    """Run every scenario; return the result (JSON-safe). ``watchdog``: a hung device call dumps the stacks
    and exits the process after twice ``--max-total-s`` (the command line sets it; tests do not)."""
    cfg = parse(argv, (package_doc or "").split("\n")[0])
    threads = torch.get_num_threads()
    if cfg.device == "cpu":
        torch.set_num_threads(1)  # less jitter in the CPU smoke run
    if watchdog:
        faulthandler.dump_traceback_later(max(60.0, cfg.max_total_s * 2 + 60.0), exit=True)
    try:
        return _main(cfg)
    finally:
        if watchdog:
            faulthandler.cancel_dump_traceback_later()
        torch.set_num_threads(threads)


def _main(cfg: Config) -> dict[str, Any]:
    device = torch.cuda.get_device_name(0) if cfg.device == "cuda" else "cpu"
    res: dict[str, Any] = {"device": device, "torch": torch.__version__, "backend": cfg.device, "smoke": cfg.smoke}
    res.update(config=asdict(cfg), scenarios={}, errors={})
    log(f"admission bench on {device} (torch {torch.__version__}), {cfg.seconds:.1f} s per scenario")
    rig = Rig(cfg)
    log(f"rig ready (graphs: serving {rig.serve_graph is not None}, rollout {rig.chunk_graph is not None})")
    bench = Bench(cfg, rig, res)
    for sc in SCENARIOS:
        run_scenario(bench, sc)
    green_dial(bench)
    res["ratios"] = ratios(res["scenarios"])
    res["targets"] = targets(res["ratios"])
    if not res["errors"]:
        del res["errors"]
    res["total_s"] = elapsed_s()
    write_out(res)
    log(f"done in {res['total_s']:.1f} s; targets met: {res['targets']['met']}")
    out: dict[str, Any] = clean(res)
    return out
