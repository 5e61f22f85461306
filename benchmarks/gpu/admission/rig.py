"""The bench's GPU side: the serving decode-step proxy and the rollout chunk on one device (weights, CUDA
streams, events and graphs; a CPU backend that runs the same work synchronously for the smoke run), and the
CUDA green context that confines extra rollout GEMMs to a few SMs."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from .config import Config, log


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
