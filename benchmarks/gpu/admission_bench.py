"""GPU co-location benchmark for the co-serving executor's dual-slack admission (issue 5, "On a GPU").

Run from the repository root (no rose package needs to be installed; only torch):

    python benchmarks/gpu/admission_bench.py [--seconds 8] [--smoke] [--device cuda|cpu]

One process, one CUDA context (``reference/gpu-measurements.md``: across processes the GPU time-slices):

- **Serving**: a decode-step proxy, ``layers`` x (32 tokens x 4096 @ 4096x14336, relu, @ 14336x4096) in bf16
  (about 2.2 ms per step alone on an H200), captured in a CUDA graph and replayed on a high-priority stream.
  An on/off arrival process (seeded, identical in every scenario) gives a ~50% serving duty cycle: bursts of
  back-to-back decode steps (each step is one token of the in-flight requests, with a TPOT budget) separated
  by exponential idle gaps.
- **Rollout**: chunked prefills, one chunk = ``chunk_gemms`` GEMMs of 512 tokens x 4096 @ 4096x14336 replayed
  from a CUDA graph on another stream.
- One host loop drives both for every scenario (same measurement everywhere): it launches serving steps as
  the schedule asks, polls CUDA events for completions, and asks a rollout policy each tick whether to
  launch a chunk. Scenarios: ``serving_alone``, ``rollout_alone``, ``unmanaged`` (rollout keeps two chunks
  queued), ``blind_duty50`` (a chunk, then idle as long as it took: the baseline's blind 50% duty cycle),
  ``guarded`` (dual-slack admission, below) and ``guarded_green`` (the same, plus a CUDA green context that
  confines extra rollout GEMMs to ``--green-sms`` SMs while serving is busy, admitted against a serving
  step time profiled under that dial).

Guarded admission (paper-notes 2.1(c)): a latency model profiled at start (serving step time T_dec, rollout
chunk time T_chunk) and SLO budgets derived from it (B_TPOT = ``--tpot-slo-mult`` x serving-alone TPOT p99;
B_TTFT = T_dec + ``--ttft-extra-chunks`` x T_chunk). Every tick, with ``now_eff = now + predicted remaining
time of the rollout chunks already queued``, the slack is

    serving burst in flight (decoding): (last_token_at or arrival) + B_TPOT - now_eff - T_dec - T_chunk
    idle gap (a request arriving now):  now + B_TTFT - now_eff - T_dec - T_chunk   (its TTFT slack)

and a chunk is launched only while the slack stays above ``--margin-ms``: no more GPU work is ever queued
than fits before the next serving deadline. (The serving proxy has no prefill: a burst's first step is held
to the TPOT rule from its arrival, so no chunk starts beside any serving step; the TTFT rule only bounds the
rollout work queued in an idle gap, i.e. what an unannounced arrival can find ahead of it.) The decision is made by ``rose_core.policy.DualSlackAdmission`` when that package is
importable from ``packages/rose-core/src`` (pure, no msgspec), checked against the inline mirror
``dual_slack_admits`` below on random states; otherwise the inline mirror decides (``admission_impl``).

Metrics: serving step latency from CUDA events on the serving stream (``tpot_step_ms``: every step except
the first of a burst, i.e. the TPOT steps; ``first_step_ms``: the first step of a burst, the TTFT side),
host-observed TPOT and first-token delay, TPOT SLO attainment, rollout TFLOP/s over the scenario's wall time.
Prints one JSON object on stdout and writes it to ``$OUT/gpu_admission.json`` when ``$OUT`` is set (also
after each scenario, so a crash leaves the finished ones). Progress lines go to stderr. ``--smoke`` runs tiny
sizes for a few tenths of a second per scenario (on CPU when there is no GPU: every path except CUDA timing).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import math
import os
import random
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
CORE_SRC = ROOT / "packages/rose-core/src"
_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - _T0:7.2f}s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- config


@dataclass
class Config:
    device: str = "cuda"
    hidden: int = 4096
    ffn: int = 14336
    serve_tokens: int = 32
    layers: int = 32
    chunk_tokens: int = 512
    chunk_gemms: int = 8
    seconds: float = 8.0
    rollout_alone_seconds: float = 3.0
    duty: float = 0.5
    burst_steps: int = 40
    tpot_slo_mult: float = 1.1
    ttft_extra_chunks: float = 1.5
    margin_ms: float = 0.05
    green_sms: int = 8
    green_tpot_mult: float = 1.25
    graphs: bool = True
    seed: int = 0
    smoke: bool = False
    inline_policy: bool = False
    max_total_s: float = 140.0

    @property
    def chunk_flop(self) -> float:
        return 2.0 * self.chunk_tokens * self.hidden * self.ffn * self.chunk_gemms

    @property
    def green_flop(self) -> float:
        return 2.0 * self.chunk_tokens * self.hidden * self.ffn


def smoke_config(cfg: Config) -> Config:
    cfg.hidden, cfg.ffn, cfg.serve_tokens, cfg.layers = 128, 256, 8, 4
    cfg.chunk_tokens, cfg.chunk_gemms = 64, 2
    cfg.seconds = min(cfg.seconds, 0.3)
    cfg.rollout_alone_seconds = min(cfg.rollout_alone_seconds, 0.2)
    cfg.burst_steps = 8
    cfg.max_total_s = min(cfg.max_total_s, 30.0)
    return cfg


# ----------------------------------------------------------------------------------------------- statistics


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]); NaN when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p99": pct(values, 99),
        "mean": sum(values) / len(values),
        "max": max(values),
    }


def clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------- admission


def dual_slack_admits(
    now_eff: float,
    serving: list[tuple[float, bool, float | None]],
    t_chunk: float,
    t_first: float,
    t_dec: float,
    b_ttft: float,
    b_tpot: float,
    margin: float,
) -> bool:
    """Inline mirror of the paper's dual-slack rule (paper-notes 2.1(c)) for one candidate rollout chunk.

    ``serving``: (arrival, in_prefill, last_token_at) per in-flight serving request. Slack of each request:
    prefill ``arrival + B_TTFT - now_eff - T_first``, decode ``last_token_at + B_TPOT - now_eff - T_dec``; the
    chunk is admitted iff ``min slack - T_chunk > margin`` (no serving request: always)."""
    worst = math.inf
    for arrival, in_prefill, last in serving:
        if in_prefill:
            worst = min(worst, arrival + b_ttft - now_eff - t_first)
        else:
            worst = min(worst, (last if last is not None else arrival) + b_tpot - now_eff - t_dec)
    return worst - margin > t_chunk


class Admission:
    """The guard's decision: ``rose_core.policy.DualSlackAdmission`` when importable, else the inline mirror."""

    def __init__(
        self,
        t_dec: float,
        t_first: float,
        t_chunk: float,
        b_tpot: float,
        b_ttft: float,
        margin: float,
        chunk_tokens: int,
        inline: bool,
    ) -> None:
        self.t_dec, self.t_first, self.t_chunk = t_dec, t_first, t_chunk
        self.b_tpot, self.b_ttft, self.margin, self.chunk_tokens = b_tpot, b_ttft, margin, chunk_tokens
        self.impl = "inline"
        self.import_error: str | None = None
        self._core: Any = None
        if inline:
            self.import_error = "--inline-policy"
            return
        try:
            if CORE_SRC.is_dir() and str(CORE_SRC) not in sys.path:
                sys.path.insert(0, str(CORE_SRC))
            from rose_core.policy.dual_slack_admission import AdmissionConfig, DualSlackAdmission
            from rose_core.policy.latency_model import LatencyModel
            from rose_core.policy.serving_request import RolloutWork, ServingRequest

            self._RW, self._SR = RolloutWork, ServingRequest
            self._core = DualSlackAdmission(
                AdmissionConfig(ttft_budget_s=b_ttft, tpot_budget_s=b_tpot, chunk_tokens=chunk_tokens, margin_s=margin),
                LatencyModel(
                    prefill_base_s=t_first, prefill_per_token_s=0.0, decode_base_s=t_dec, decode_per_seq_s=0.0
                ),
                LatencyModel(
                    prefill_base_s=0.0,
                    prefill_per_token_s=t_chunk / chunk_tokens,
                    decode_base_s=0.0,
                    decode_per_seq_s=0.0,
                ),
            )
            self._candidate = [RolloutWork("rollout-chunk", "prefill", chunk_tokens)]
            self.impl = "rose_core.policy.DualSlackAdmission"
        except Exception as exc:  # any import error or API drift: fall back to the inline rule
            self.import_error = f"{type(exc).__name__}: {exc}"
            self._core = None

    def admits(self, now_eff: float, serving: list[tuple[float, bool, float | None]]) -> bool:
        if self._core is None:
            return self._inline(now_eff, serving)
        reqs = [
            self._SR(f"s{i}", arrival=a, remaining_prompt_tokens=1 if pre else 0, last_token_at=last)
            for i, (a, pre, last) in enumerate(serving)
        ]
        decision = self._core.admit(now_eff, reqs, self._candidate)
        return decision.prefill_tokens >= self.chunk_tokens

    def _inline(self, now_eff: float, serving: list[tuple[float, bool, float | None]]) -> bool:
        return dual_slack_admits(
            now_eff, serving, self.t_chunk, self.t_first, self.t_dec, self.b_ttft, self.b_tpot, self.margin
        )

    def self_check(self, cases: int = 300, seed: int = 1) -> dict[str, Any]:
        """Compare the rose_core decision with the inline mirror on random states; on any mismatch or error,
        switch to the inline rule (reported)."""
        if self._core is None:
            return {"checked": 0, "agree": 0, "impl": self.impl, "import_error": self.import_error}
        rng = random.Random(seed)
        agree = 0
        try:
            for _ in range(cases):
                now = rng.uniform(0.0, 1.0)
                serving: list[tuple[float, bool, float | None]] = []
                if rng.random() < 0.8:
                    pre = rng.random() < 0.3
                    arrival = now - rng.uniform(0.0, 3 * self.b_ttft)
                    last = None if pre else now - rng.uniform(0.0, 1.5 * self.b_tpot)
                    serving.append((arrival, pre, last))
                now_eff = now + rng.uniform(0.0, 2 * self.t_chunk)
                agree += self.admits(now_eff, serving) == self._inline(now_eff, serving)
        except Exception as exc:
            self.import_error = f"rose_core admit failed: {type(exc).__name__}: {exc}"
            self._core, self.impl = None, "inline"
            return {"checked": cases, "agree": agree, "impl": self.impl, "import_error": self.import_error}
        out = {"checked": cases, "agree": agree, "impl": self.impl}
        if agree != cases:
            self._core, self.impl = None, "inline"
            out["impl"] = self.impl
            out["note"] = "rose_core disagreed with the inline rule: using the inline rule"
        return out


# ----------------------------------------------------------------------------------------------- workloads


class Handle:
    """One piece of launched GPU work: ``done()`` polls without blocking; ``gpu_ms()`` after it is done."""

    __slots__ = ("_cpu_ms", "_ev_a", "_ev_b", "_stream", "t_launch")

    def __init__(
        self, t_launch: float, ev_a: Any = None, ev_b: Any = None, stream: Any = None, cpu_ms: float | None = None
    ) -> None:
        self.t_launch, self._ev_a, self._ev_b, self._stream, self._cpu_ms = t_launch, ev_a, ev_b, stream, cpu_ms

    def done(self) -> bool:
        if self._cpu_ms is not None:
            return True
        if self._ev_b is not None:
            return bool(self._ev_b.query())
        return bool(self._stream.query())

    def gpu_ms(self) -> float:
        if self._cpu_ms is not None:
            return self._cpu_ms
        if self._ev_a is None:
            return float("nan")
        return float(self._ev_a.elapsed_time(self._ev_b))


class Rig:
    """The serving step and the rollout chunk on one device (CUDA: streams, events, graphs; CPU: synchronous)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.cuda = cfg.device == "cuda"
        dev = torch.device("cuda:0" if self.cuda else "cpu")
        dtype = torch.bfloat16 if self.cuda else torch.float32
        gen = torch.Generator(device=dev).manual_seed(cfg.seed)
        h, f = cfg.hidden, cfg.ffn
        self.w1 = (torch.randn(h, f, device=dev, generator=gen) * 0.01).to(dtype)
        self.w2 = (torch.randn(f, h, device=dev, generator=gen) * 0.01).to(dtype)
        self.x = torch.randn(cfg.serve_tokens, h, device=dev, generator=gen).to(dtype)
        self.a = torch.randn(cfg.chunk_tokens, h, device=dev, generator=gen).to(dtype)
        self.wr = (torch.randn(h, f, device=dev, generator=gen) * 0.01).to(dtype)
        self.serve_graph: Any = None
        self.chunk_graph: Any = None
        self.green_stream: Any = None
        self.green_info: dict[str, Any] = {"available": False, "reason": "not tried"}
        if not self.cuda:
            self.green_info["reason"] = "cpu backend"
            return
        self.s_serve = torch.cuda.Stream(priority=-1)  # the highest priority (it does not help; admission does)
        self.s_roll = torch.cuda.Stream(priority=0)
        for s in (self.s_serve, self.s_roll):
            with torch.cuda.stream(s):
                for _ in range(3):
                    self._serve_eager()
                    self._chunk_eager(1)
        torch.cuda.synchronize()
        if cfg.graphs:
            try:
                self.serve_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.serve_graph, stream=self.s_serve):
                    self._serve_out = self._serve_eager()
                self.chunk_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.chunk_graph, stream=self.s_roll):
                    self._chunk_out = self._chunk_eager(cfg.chunk_gemms)
                torch.cuda.synchronize()
            except Exception as exc:
                log(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); running eager")
                self.serve_graph = self.chunk_graph = None
                torch.cuda.synchronize()

    # -- kernels
    def _serve_eager(self) -> torch.Tensor:
        x = self.x
        for _ in range(self.cfg.layers):
            x = (x @ self.w1).relu_() @ self.w2
        return x

    def _chunk_eager(self, gemms: int) -> torch.Tensor:
        out = self.a @ self.wr
        for _ in range(gemms - 1):
            out = self.a @ self.wr
        return out

    # -- launches
    def serve(self, t: float) -> Handle:
        if not self.cuda:
            t0 = time.perf_counter()
            self._serve_eager()
            return Handle(t, cpu_ms=(time.perf_counter() - t0) * 1e3)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.s_serve):
            a.record(self.s_serve)
            if self.serve_graph is not None:
                self.serve_graph.replay()
            else:
                self._serve_eager()
            b.record(self.s_serve)
        return Handle(t, a, b)

    def chunk(self, t: float, timed: bool = False) -> Handle:
        if not self.cuda:
            t0 = time.perf_counter()
            self._chunk_eager(self.cfg.chunk_gemms)
            return Handle(t, cpu_ms=(time.perf_counter() - t0) * 1e3)
        a = torch.cuda.Event(enable_timing=True) if timed else None
        b = torch.cuda.Event(enable_timing=timed)
        with torch.cuda.stream(self.s_roll):
            if a is not None:
                a.record(self.s_roll)
            if self.chunk_graph is not None:
                self.chunk_graph.replay()
            else:
                self._chunk_eager(self.cfg.chunk_gemms)
            b.record(self.s_roll)
        return Handle(t, a, b)

    def green(self, t: float) -> Handle:
        """One rollout GEMM (chunk_tokens x hidden @ hidden x ffn), eager, on the green context's stream;
        completion is polled on the stream (no cross-context events)."""
        with torch.cuda.stream(self.green_stream):
            self.a @ self.wr
        return Handle(t, stream=self.green_stream)

    def sync(self) -> None:
        if self.cuda:
            if self.green_stream is not None:
                self.green_stream.synchronize()
            torch.cuda.synchronize()

    def setup_green(self) -> None:
        """Create a green context of ``green_sms`` SMs and its stream, if torch has the API."""
        info: dict[str, Any] = {"available": False, "sms": self.cfg.green_sms}
        self.green_info = info
        gc = getattr(torch.cuda, "green_contexts", None)
        if gc is None:
            with contextlib.suppress(Exception):
                import torch.cuda.green_contexts as gc
        if gc is None or not hasattr(gc, "GreenContext"):
            info["reason"] = "torch.cuda.green_contexts missing"
            return
        if getattr(gc, "SUPPORTED", True) is False:
            info["reason"] = "torch built without green context support"
            return
        try:
            try:
                ctx = gc.GreenContext.create(num_sms=self.cfg.green_sms, device_id=0)
            except TypeError:
                ctx = gc.GreenContext.create(self.cfg.green_sms, 0)
            self._green_ctx = ctx
            if hasattr(ctx, "Stream"):
                self.green_stream = ctx.Stream()
                info["stream_from"] = "GreenContext.Stream()"
            else:  # older API: the current stream while the green context is current
                push = getattr(ctx, "set_context", None) or ctx.make_current
                pop = getattr(ctx, "pop_context", None) or ctx.pop_current
                default = torch.cuda.current_stream()
                push()
                try:
                    stream = torch.cuda.current_stream()
                finally:
                    pop()
                if stream == default:
                    info["reason"] = "GreenContext has no Stream() and set_context kept the default stream"
                    return
                self.green_stream = stream
                info["stream_from"] = "current stream under set_context (confinement checked by throughput)"
            self.green(0.0)
            self.green_stream.synchronize()
            torch.cuda.synchronize()
            info["available"] = True
            info["reason"] = "ok"
        except Exception as exc:
            info["reason"] = f"{type(exc).__name__}: {exc}"
            self.green_stream = None


# ----------------------------------------------------------------------------------------------- the loop


@dataclass
class Burst:
    arrival: float
    steps: int


def make_schedule(seconds: float, step_s: float, duty: float, mean_steps: int, seed: int) -> list[Burst]:
    """On/off serving arrivals: bursts of ``mean_steps`` +- 50% back-to-back steps (uniform), each after an
    exponential idle gap; gaps are rescaled so that busy time / (busy + idle time) is exactly ``duty`` (at
    ``step_s`` per step) and the bursts fill at most ``seconds``."""
    rng = random.Random(seed)
    if duty <= 0:
        return []
    lo, hi = max(2, mean_steps // 2), max(2, (3 * mean_steps) // 2)
    steps: list[int] = []
    gaps: list[float] = []
    busy = 0.0
    while True:
        n = rng.randint(lo, hi)
        if steps and busy + n * step_s > duty * seconds:
            break
        steps.append(n)
        gaps.append(rng.expovariate(1.0))
        busy += n * step_s
    scale = busy * (1.0 - duty) / duty / sum(gaps) if duty < 1.0 else 0.0
    out: list[Burst] = []
    t = 0.0
    for n, g in zip(steps, gaps, strict=True):
        t += g * scale
        out.append(Burst(t, n))
        t += n * step_s
    return out


@dataclass
class InFlight:
    handle: Handle
    pred_end: float
    lane: str


@dataclass
class View:
    """What a rollout policy sees and can do at one tick (times in seconds since the scenario start)."""

    now: float = 0.0
    serving_active: bool = False
    arrival: float = 0.0
    last_token_at: float | None = None
    step_launch: float | None = None
    full: list[InFlight] = field(default_factory=list)
    green: list[InFlight] = field(default_factory=list)
    launch_full: Callable[[], None] | None = None
    launch_green: Callable[[], None] | None = None
    t_chunk: float = 0.0

    def full_pending_s(self) -> float:
        """Predicted GPU time of queued full-GPU rollout work still ahead of ``now`` (overdue chunks count
        0.1 chunk: they are still running)."""
        if not self.full:
            return 0.0
        return max(self.full[-1].pred_end - self.now, 0.1 * self.t_chunk)


class Policy:
    name = "none"

    def tick(self, v: View) -> None:
        pass

    def done(self, lane: str, t_launch: float, t_done: float) -> None:
        pass


class Saturate(Policy):
    def __init__(self, lane: str = "full", depth: int = 2) -> None:
        self.name, self.lane, self.depth = f"saturate_{lane}", lane, depth

    def tick(self, v: View) -> None:
        if self.lane == "full":
            while len(v.full) < self.depth and v.launch_full is not None:
                v.launch_full()
        else:
            while len(v.green) < self.depth and v.launch_green is not None:
                v.launch_green()


class BlindDuty(Policy):
    """The baseline's blind duty cycle: run one chunk, then stay idle as long as it took (duty 0.5)."""

    name = "blind_duty"

    def __init__(self, duty: float = 0.5) -> None:
        self.duty, self.next_ok = duty, 0.0

    def tick(self, v: View) -> None:
        if not v.full and v.now >= self.next_ok and v.launch_full is not None:
            v.launch_full()

    def done(self, lane: str, t_launch: float, t_done: float) -> None:
        self.next_ok = t_done + (t_done - t_launch) * (1.0 - self.duty) / self.duty


class Guarded(Policy):
    """Dual-slack admission of full-GPU chunks; optionally the green-context dial during serving bursts."""

    name = "guarded"

    def __init__(self, admission: Admission, green: Admission | None = None) -> None:
        self.adm, self.green_adm = admission, green
        self.admitted = self.admitted_while_serving = self.green_admitted = 0
        self._held_step: float | None = None

    def _serving(self, v: View) -> list[tuple[float, bool, float | None]]:
        if v.serving_active:  # decoding: the next token is due B_TPOT after the last one (or the arrival)
            return [(v.arrival, False, v.last_token_at if v.last_token_at is not None else v.arrival)]
        return [(v.now, True, None)]  # idle: a request that would arrive right now (its TTFT slack)

    def tick(self, v: View) -> None:
        serving = self._serving(v)
        # while a serving step is in flight the TPOT slack only shrinks: once held, skip re-evaluating the
        # full-GPU lane until the next step (keeps the host loop fast between serving steps)
        if not (v.serving_active and v.step_launch is not None and v.step_launch == self._held_step):
            n = 0  # a few launches at most per tick, each re-evaluated against the grown queue
            while n < 4 and v.launch_full is not None and self.adm.admits(v.now + v.full_pending_s(), serving):
                v.launch_full()
                n += 1
            self.admitted += n
            if v.serving_active:
                self.admitted_while_serving += n
                if n == 0:
                    self._held_step = v.step_launch
        if self.green_adm is None or not v.serving_active or v.green or v.launch_green is None:
            return
        # the dial: slack of the serving step in flight, from its launch, under the serving model profiled with
        # the confined rollout running beside it
        t_ref = v.step_launch if v.step_launch is not None else v.now
        if self.green_adm.admits(t_ref + v.full_pending_s(), serving):
            v.launch_green()
            self.green_admitted += 1


class Recorder:
    def __init__(self) -> None:
        self.tpot_step_ms: list[float] = []
        self.first_step_ms: list[float] = []
        self.host_tpot_ms: list[float] = []
        self.first_delay_ms: list[float] = []
        self.busy_gpu_ms = 0.0
        self.full_chunks = 0
        self.green_gemms = 0


def run_loop(
    rig: Rig,
    policy: Policy,
    bursts: list[Burst],
    seconds: float,
    t_chunk: float,
    hard_timeout_s: float,
    until_idle: bool = False,
) -> tuple[Recorder, float]:
    """Drive serving bursts and the rollout policy until ``seconds`` (or, with ``until_idle``, until every
    burst is served); return the records and the wall time (including the drain of the rollout work launched
    before the end)."""
    rec = Recorder()
    pending = deque(bursts)
    v = View(t_chunk=t_chunk)
    clock = time.perf_counter
    t0 = clock()
    green_ok = rig.green_stream is not None

    def launch_full() -> None:
        now = clock() - t0
        start = max(now, v.full[-1].pred_end) if v.full else now
        v.full.append(InFlight(rig.chunk(now), start + t_chunk, "full"))

    def launch_green() -> None:
        now = clock() - t0
        v.green.append(InFlight(rig.green(now), now, "green"))

    v.launch_full = launch_full
    v.launch_green = launch_green if green_ok else None
    active: Burst | None = None
    left = 0
    serv: Handle | None = None
    first = False
    while True:
        now = clock() - t0
        if serv is not None and serv.done():
            t_done = clock() - t0
            ms = serv.gpu_ms()
            rec.busy_gpu_ms += ms
            if first:
                rec.first_step_ms.append(ms)
                rec.first_delay_ms.append((t_done - active.arrival) * 1e3 if active else float("nan"))
            else:
                rec.tpot_step_ms.append(ms)
                if v.last_token_at is not None:
                    rec.host_tpot_ms.append((t_done - v.last_token_at) * 1e3)
            v.last_token_at = t_done
            serv, v.step_launch = None, None
            left -= 1
            if left <= 0:
                active, v.serving_active, v.last_token_at = None, False, None
        if serv is None and now < seconds:
            if active is None and pending and pending[0].arrival <= now:
                active = pending.popleft()
                left, v.serving_active, v.arrival, v.last_token_at = active.steps, True, active.arrival, None
            if active is not None:
                first = v.last_token_at is None
                v.step_launch = clock() - t0
                serv = rig.serve(v.step_launch)
        v.now = clock() - t0
        while v.full and v.full[0].handle.done():
            d = v.full.pop(0)
            rec.full_chunks += 1
            policy.done("full", d.handle.t_launch, v.now)
        while v.green and v.green[0].handle.done():
            d = v.green.pop(0)
            rec.green_gemms += 1
            policy.done("green", d.handle.t_launch, v.now)
        finished = v.now >= seconds or (until_idle and not pending and active is None)
        if not finished:
            policy.tick(v)
        elif serv is None:
            break
        if v.now > hard_timeout_s:
            raise TimeoutError(f"scenario loop exceeded {hard_timeout_s:.0f} s")
    rig.sync()
    rec.full_chunks += len(v.full)
    rec.green_gemms += len(v.green)
    v.full.clear()
    v.green.clear()
    return rec, clock() - t0


def scenario_result(cfg: Config, rec: Recorder, wall: float, b_tpot_ms: float) -> dict[str, Any]:
    flop = rec.full_chunks * cfg.chunk_flop + rec.green_gemms * cfg.green_flop
    ok = sum(1 for t in rec.host_tpot_ms if t <= b_tpot_ms)
    return {
        "tpot_step_ms": summary(rec.tpot_step_ms),
        "first_step_ms": summary(rec.first_step_ms),
        "all_step_ms": summary(rec.tpot_step_ms + rec.first_step_ms),
        "host_tpot_ms": summary(rec.host_tpot_ms),
        "first_token_delay_ms": summary(rec.first_delay_ms),
        "tpot_slo_attainment": ok / len(rec.host_tpot_ms) if rec.host_tpot_ms else None,
        "serving_busy_fraction": rec.busy_gpu_ms / 1e3 / wall if wall > 0 else None,
        "rollout_tflops": flop / wall / 1e12 if wall > 0 else 0.0,
        "rollout_full_chunks": rec.full_chunks,
        "rollout_green_gemms": rec.green_gemms,
        "wall_s": wall,
    }


# ----------------------------------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    d = Config()
    p.add_argument("--smoke", action="store_true", help="tiny sizes, ~0.3 s per scenario (CPU when no GPU)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--seconds", type=float, default=d.seconds, help="wall seconds per co-location scenario")
    p.add_argument("--chunk-gemms", type=int, default=d.chunk_gemms, help="512-token GEMMs per rollout chunk")
    p.add_argument("--chunk-tokens", type=int, default=d.chunk_tokens)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--duty", type=float, default=d.duty, help="serving duty cycle of the arrival process")
    p.add_argument("--burst-steps", type=int, default=d.burst_steps, help="mean decode steps per serving burst")
    p.add_argument("--tpot-slo-mult", type=float, default=d.tpot_slo_mult)
    p.add_argument("--ttft-extra-chunks", type=float, default=d.ttft_extra_chunks)
    p.add_argument("--margin-ms", type=float, default=d.margin_ms)
    p.add_argument("--green-sms", type=int, default=d.green_sms, help="SMs of the green context (0: no dial)")
    p.add_argument("--green-tpot-mult", type=float, default=d.green_tpot_mult)
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--inline-policy", action="store_true", help="do not import rose_core; use the inline rule")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-total-s", type=float, default=d.max_total_s, help="skip scenarios past this budget")
    a = p.parse_args(argv)
    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False")
    cfg = Config(
        device=device,
        seconds=a.seconds,
        chunk_gemms=a.chunk_gemms,
        chunk_tokens=a.chunk_tokens,
        layers=a.layers,
        duty=a.duty,
        burst_steps=a.burst_steps,
        tpot_slo_mult=a.tpot_slo_mult,
        ttft_extra_chunks=a.ttft_extra_chunks,
        margin_ms=a.margin_ms,
        green_sms=a.green_sms,
        green_tpot_mult=a.green_tpot_mult,
        graphs=not a.no_graphs,
        seed=a.seed,
        smoke=a.smoke,
        inline_policy=a.inline_policy,
        max_total_s=a.max_total_s,
    )
    return smoke_config(cfg) if a.smoke else cfg


def write_out(res: dict[str, Any]) -> None:
    out = os.environ.get("OUT")
    if not out:
        return
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_admission.json").write_text(json.dumps(clean(res), indent=1))
    except OSError as exc:
        log(f"cannot write $OUT/gpu_admission.json: {exc}")


@contextlib.contextmanager
def guarded_section(res: dict[str, Any], name: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # one failure must not hide the other scenarios
        res.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
        log(f"{name} FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        if torch.cuda.is_available():
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
    finally:
        write_out(res)


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


def main(argv: list[str] | None = None, watchdog: bool = False) -> dict[str, Any]:
    """Run every scenario; return the result (JSON-safe). ``watchdog``: a hung device call dumps the stacks
    and exits the process after twice ``--max-total-s`` (the command line sets it; tests do not)."""
    cfg = parse(argv)
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
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if cfg.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "backend": cfg.device,
        "smoke": cfg.smoke,
        "config": asdict(cfg),
        "scenarios": {},
        "errors": {},
    }
    log(f"admission bench on {res['device']} (torch {torch.__version__}), {cfg.seconds:.1f} s per scenario")
    rig = Rig(cfg)
    log(f"rig ready (graphs: serving {rig.serve_graph is not None}, rollout {rig.chunk_graph is not None})")
    prof = profile(rig, cfg)
    res["profile"] = prof
    t_dec = prof["serving_host_tpot_ms"].get("p99", float("nan")) / 1e3
    if not math.isfinite(t_dec):
        t_dec = prof["serving_step_ms"]["p99"] / 1e3
    t_first = prof["serving_step_ms"]["p99"] / 1e3
    t_chunk = prof["rollout_chunk_ms"]["p99"] / 1e3
    step_s = prof["serving_host_tpot_ms"].get("mean", prof["serving_step_ms"]["mean"]) / 1e3
    b_tpot = cfg.tpot_slo_mult * t_dec
    b_ttft = t_first + cfg.ttft_extra_chunks * t_chunk
    margin = cfg.margin_ms / 1e3
    res["latency_model"] = {
        "t_dec_ms": t_dec * 1e3,
        "t_first_ms": t_first * 1e3,
        "t_chunk_ms": t_chunk * 1e3,
        "tpot_budget_ms": b_tpot * 1e3,
        "ttft_budget_ms": b_ttft * 1e3,
        "margin_ms": cfg.margin_ms,
    }
    log(
        f"profile: serving step p50/p99 {prof['serving_step_ms']['p50']:.3f}/{prof['serving_step_ms']['p99']:.3f}"
        f" ms, host TPOT p99 {t_dec * 1e3:.3f} ms, chunk p50/p99 {prof['rollout_chunk_ms']['p50']:.3f}/"
        f"{t_chunk * 1e3:.3f} ms, rollout direct {prof['rollout_alone_direct_tflops']:.1f} TFLOP/s"
    )
    adm = Admission(t_dec, t_first, t_chunk, b_tpot, b_ttft, margin, cfg.chunk_tokens, cfg.inline_policy)
    res["policy_check"] = adm.self_check()
    res["admission_impl"] = adm.impl
    log(f"admission: {adm.impl} {res['policy_check']}")
    write_out(res)

    deadline = time.perf_counter() + cfg.max_total_s
    schedule = make_schedule(cfg.seconds, step_s, cfg.duty, cfg.burst_steps, cfg.seed)
    res["schedule"] = {
        "bursts": len(schedule),
        "steps": sum(b.steps for b in schedule),
        "planned_busy_fraction": sum(b.steps for b in schedule) * step_s / cfg.seconds,
    }
    scen = res["scenarios"]
    hard = cfg.seconds * 3 + 30.0

    def run(name: str, policy: Policy, bursts: list[Burst], seconds: float) -> None:
        if time.perf_counter() > deadline:
            res["errors"][name] = f"skipped: past --max-total-s {cfg.max_total_s:.0f}"
            log(f"{name}: skipped (time budget)")
            return
        with guarded_section(res, name):
            log(f"{name}: start ({policy.name})")
            rec, wall = run_loop(rig, policy, bursts, seconds, t_chunk, hard)
            r = scenario_result(cfg, rec, wall, b_tpot * 1e3)
            if isinstance(policy, Guarded):
                r["admitted_chunks"], r["green_admitted"] = policy.admitted, policy.green_admitted
                r["admitted_chunks_while_serving"] = policy.admitted_while_serving
            scen[name] = r
            log(
                f"{name}: TPOT step p50/p99 {r['tpot_step_ms'].get('p50', float('nan')):.3f}/"
                f"{r['tpot_step_ms'].get('p99', float('nan')):.3f} ms, first step p99 "
                f"{r['first_step_ms'].get('p99', float('nan')):.3f} ms, rollout {r['rollout_tflops']:.1f} TFLOP/s"
            )

    run("serving_alone", Policy(), schedule, cfg.seconds)
    run("rollout_alone", Saturate("full", 2), [], cfg.rollout_alone_seconds)
    run("unmanaged", Saturate("full", 2), schedule, cfg.seconds)
    run("blind_duty50", BlindDuty(0.5), schedule, cfg.seconds)
    run("guarded", Guarded(adm), schedule, cfg.seconds)

    green: dict[str, Any] = {"available": False, "reason": "--green-sms 0"}
    if cfg.green_sms > 0 and rig.cuda:
        with guarded_section(res, "green_setup"):
            rig.setup_green()
        green = rig.green_info
    elif not rig.cuda:
        green = {"available": False, "reason": "cpu backend"}
    res["green_context"] = green
    if green.get("available"):
        with guarded_section(res, "green_profile"):
            rec, wall = run_loop(rig, Saturate("green", 1), [], min(1.0, cfg.rollout_alone_seconds), t_chunk, hard)
            green["rollout_alone_tflops"] = rec.green_gemms * cfg.green_flop / wall / 1e12
            direct = prof["rollout_alone_direct_tflops"]
            # confined to green_sms of the device's SMs, the rollout must run far below its all-SM rate
            green["device_sms"] = torch.cuda.get_device_properties(0).multi_processor_count
            green["confinement_effective"] = green["rollout_alone_tflops"] < 0.5 * direct if direct else None
            n = 30 if cfg.smoke else 150
            rec, wall = run_loop(rig, Saturate("green", 1), [Burst(0.0, n)], 1e9, t_chunk, hard, until_idle=True)
            green["serving_step_ms"] = summary(rec.tpot_step_ms)
            green["serving_host_tpot_ms"] = summary(rec.host_tpot_ms)
            green["rollout_tflops_during_serving"] = rec.green_gemms * cfg.green_flop / wall / 1e12
            t_dec_g = green["serving_host_tpot_ms"]["p99"] / 1e3
            b_tpot_g = cfg.green_tpot_mult * t_dec
            green["tpot_budget_ms"] = b_tpot_g * 1e3
            green["t_dec_under_dial_ms"] = t_dec_g * 1e3
            log(
                f"green {cfg.green_sms} SMs: rollout alone {green['rollout_alone_tflops']:.1f} TFLOP/s, serving "
                f"step p99 under the dial {green['serving_step_ms'].get('p99', float('nan')):.3f} ms"
            )
            # the same dual-slack rule, with the serving model profiled under the dial; the confined GEMM adds
            # no serial time (its cost is inside t_dec_g)
            gadm = Admission(t_dec_g, t_first, 0.0, b_tpot_g, b_ttft, margin, cfg.chunk_tokens, cfg.inline_policy)
            res["green_policy_check"] = gadm.self_check()
            run("guarded_green", Guarded(adm, gadm), schedule, cfg.seconds)
    else:
        log(f"green context unavailable: {green.get('reason')}")

    res["ratios"] = ratios(scen)
    g = res["ratios"]
    res["targets"] = {
        "serving_p99_ratio_max": 1.1,
        "rollout_ratio_min": 0.40,
        "serving_met": g.get("guarded_tpot_p99_over_alone") is not None and g["guarded_tpot_p99_over_alone"] <= 1.1,
        "rollout_met": g.get("guarded_rollout_over_alone") is not None and g["guarded_rollout_over_alone"] >= 0.40,
    }
    res["targets"]["met"] = res["targets"]["serving_met"] and res["targets"]["rollout_met"]
    if not res["errors"]:
        del res["errors"]
    res["total_s"] = time.perf_counter() - _T0
    write_out(res)
    log(f"done in {res['total_s']:.1f} s; targets met: {res['targets']['met']}")
    return clean(res)


def ratios(scen: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    alone = scen.get("serving_alone", {})
    roll = scen.get("rollout_alone", {}).get("rollout_tflops")
    idle = None
    if alone.get("serving_busy_fraction") is not None:
        idle = max(1e-9, 1.0 - alone["serving_busy_fraction"])
    for name in ("unmanaged", "blind_duty50", "guarded", "guarded_green"):
        r = scen.get(name)
        if not r:
            continue
        for key, metric in (("tpot", "tpot_step_ms"), ("all_step", "all_step_ms"), ("first_step", "first_step_ms")):
            a, b = alone.get(metric, {}).get("p99"), r.get(metric, {}).get("p99")
            out[f"{name}_{key}_p99_over_alone"] = b / a if a and b is not None and math.isfinite(a) else None
        out[f"{name}_rollout_over_alone"] = r["rollout_tflops"] / roll if roll else None
        out[f"{name}_harvest_ratio"] = r["rollout_tflops"] / (roll * idle) if roll and idle else None
    return out


def print_table(res: dict[str, Any]) -> None:
    """A short table on stderr (after the JSON, so it ends the output)."""
    lines = ["scenario | TPOT step p50/p99 ms | first step p99 ms | host TPOT p99 ms | SLO att. | rollout TFLOP/s"]
    for name, r in res.get("scenarios", {}).items():
        t, f, h = r["tpot_step_ms"], r["first_step_ms"], r["host_tpot_ms"]
        lines.append(
            f"{name} | {t.get('p50') or 0:.3f} / {t.get('p99') or 0:.3f} | {f.get('p99') or 0:.3f} | "
            f"{h.get('p99') or 0:.3f} | {r['tpot_slo_attainment'] or 0:.3f} | {r['rollout_tflops']:.1f}"
        )
    g = res.get("ratios", {})
    lines.append(
        f"guarded TPOT p99 / alone = {g.get('guarded_tpot_p99_over_alone')} (target <= 1.1); guarded rollout "
        f"/ alone = {g.get('guarded_rollout_over_alone')} (target >= 0.40); errors: {res.get('errors')}"
    )
    print("\n".join(lines), file=sys.stderr, flush=True)


if __name__ == "__main__":
    result = main(watchdog=True)
    print(json.dumps(result, separators=(",", ":")), flush=True)
    print_table(result)
