"""The "true" step time of a model on a GPU in the simulator: a roofline from published specs.

``step = overhead + max(FLOPs / (peak * compute_efficiency), bytes / (HBM * bandwidth_efficiency))`` per
tensor-parallel rank, with FLOPs = 2 * params * tokens and bytes = weights + KV read. The admission policy
never sees this: it gets an affine ``LatencyModel`` fitted to points profiled from it (as the executor
profiles a real GPU at start-up), so the simulator keeps the real gap between a model and the hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

from rose_core.app.sim.scenario import GpuSpec, ModelSpec
from rose_core.policy import LatencyModel


@dataclass(slots=True, frozen=True)
class RooflineModel:
    gpu: GpuSpec
    model: ModelSpec

    @property
    def _flops(self) -> float:
        return self.gpu.peak_tflops * 1e12 * self.gpu.compute_efficiency

    @property
    def _bandwidth(self) -> float:
        return self.gpu.hbm_tb_s * 1e12 * self.gpu.bandwidth_efficiency

    @property
    def weight_bytes(self) -> float:
        """bf16 weights per TP rank."""
        return 2 * self.model.params_b * 1e9 / self.model.tp

    def step_s(self, decode_batch: float, prefill_tokens: float, context_tokens: float = 2048.0) -> float:
        """One engine step decoding ``decode_batch`` sequences of ``context_tokens`` context and prefilling
        ``prefill_tokens`` tokens."""
        if decode_batch <= 0 and prefill_tokens <= 0:
            return 0.0
        tp = self.model.tp
        flops = 2 * self.model.params_b * 1e9 * (decode_batch + prefill_tokens) / tp
        kv = decode_batch * context_tokens * self.model.kv_bytes_per_token / tp
        return self.gpu.step_overhead_ms / 1000 + max(flops / self._flops, (self.weight_bytes + kv) / self._bandwidth)

    def prefill_s(self, tokens: float, chunk_tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        full, rest = divmod(tokens, chunk_tokens)
        return full * self.step_s(0, chunk_tokens) + (self.step_s(0, rest) if rest else 0.0)

    def profile(self) -> LatencyModel:
        """What a start-up profile would measure, fitted affinely."""
        prefill = [(t, self.step_s(0, t)) for t in (128, 256, 512, 1024, 2048, 4096)]
        decode = [(b, self.step_s(b, 0)) for b in (1, 4, 8, 16, 32, 64, 128)]
        return LatencyModel.fit(prefill, decode)
