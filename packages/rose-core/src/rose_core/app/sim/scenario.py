"""A simulated scenario: GPUs, models, cluster, serving traffic, RL workload, elastic baselines (TOML).

Field defaults are the paper-8b setup; every shipped scenario file cites the source of each value.
Validation raises ``ValueError`` in ``__post_init__``; ``load_scenario`` turns any error into one line that
names the field.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

import msgspec

from rose_core.config.sections import ConfigSection, parse_toml, require_fraction, require_positive
from rose_core.support.errors import ConfigError

SYSTEMS = ("fixed", "fixed-async", "elastic-spot", "serverless", "rose")
SystemName = Literal["fixed", "fixed-async", "elastic-spot", "serverless", "rose", "rose-async"]
Algorithm = Literal["grpo", "dapo"]


_Spec = ConfigSection
_positive = require_positive
_fraction = require_fraction


class GpuSpec(_Spec):
    name: str = "H800-SXM"
    peak_tflops: float = 989.0
    hbm_tb_s: float = 3.35
    memory_gib: float = 80.0
    compute_efficiency: float = 0.72
    bandwidth_efficiency: float = 0.88
    step_overhead_ms: float = 4.0

    def __post_init__(self) -> None:
        _positive(peak_tflops=self.peak_tflops, hbm_tb_s=self.hbm_tb_s, memory_gib=self.memory_gib,
                  step_overhead_ms=self.step_overhead_ms)
        _fraction(compute_efficiency=self.compute_efficiency, bandwidth_efficiency=self.bandwidth_efficiency)


class ModelSpec(_Spec):
    name: str = "Qwen3-8B"
    params_b: float = 8.2
    kv_bytes_per_token: int = 147456
    tp: int = 1

    def __post_init__(self) -> None:
        _positive(params_b=self.params_b, kv_bytes_per_token=self.kv_bytes_per_token, tp=self.tp)


class ServingSpec(_Spec):
    model: ModelSpec = msgspec.field(default_factory=lambda: ModelSpec(name="Qwen2.5-7B", params_b=7.6,
                                                                       kv_bytes_per_token=57344))
    ttft_slo_ms: float = 500.0
    tpot_slo_ms: float = 150.0
    traffic: Literal["synthetic", "azure-csv"] = "synthetic"
    trace_csv: str = ""
    mean_compute_use: float = 0.19
    second_peak_to_mean: float = 4.22
    minute_peak_to_mean: float = 1.7
    prompt_tokens_mean: float = 1100.0
    output_tokens_mean: float = 210.0
    chunk_tokens: int = 2048
    candidates_per_borrowed: float = 2.0
    """The serving fleet offers this many GPUs per borrowable slot; the scheduler borrows the lowest-KV ones."""
    admission_margin_ms: float = 0.0
    """The co-serving guard's margin (the executor's ``admission_margin_ms``, default 0); the guard adds the
    hold margin (the rollout step at ``workload.concurrency_per_worker`` with a prefill chunk) to it, as the executor does."""

    def __post_init__(self) -> None:
        _positive(ttft_slo_ms=self.ttft_slo_ms, tpot_slo_ms=self.tpot_slo_ms, chunk_tokens=self.chunk_tokens,
                  prompt_tokens_mean=self.prompt_tokens_mean, output_tokens_mean=self.output_tokens_mean)
        _fraction(mean_compute_use=self.mean_compute_use)
        if self.second_peak_to_mean < self.minute_peak_to_mean or self.minute_peak_to_mean < 1:
            raise ValueError("need 1 <= `minute_peak_to_mean` <= `second_peak_to_mean`")
        if self.traffic == "azure-csv" and not self.trace_csv:
            raise ValueError("`trace_csv` is required when `traffic` = 'azure-csv'")
        if self.candidates_per_borrowed < 1:
            raise ValueError("`candidates_per_borrowed` must be >= 1")
        if not self.admission_margin_ms >= 0:
            raise ValueError("`admission_margin_ms` must be >= 0")


class ClusterSpec(_Spec):
    training_gpus: int = 8
    dedicated_rollout_gpus: int = 8
    borrowable_gpus: int = 16
    intra_gbps: float = 400.0
    cross_gbps: float = 200.0

    def __post_init__(self) -> None:
        _positive(training_gpus=self.training_gpus, dedicated_rollout_gpus=self.dedicated_rollout_gpus,
                  intra_gbps=self.intra_gbps, cross_gbps=self.cross_gbps)
        if self.borrowable_gpus < 0:
            raise ValueError("`borrowable_gpus` must be >= 0")


class WorkloadSpec(_Spec):
    algorithms: list[Algorithm] = msgspec.field(default_factory=lambda: ["grpo", "dapo"])
    steps: int = 10
    group_size: int = 16
    batch: int = 256
    """Trajectories per training step (``batch / group_size`` prompts)."""
    concurrency_per_worker: int = 16
    prompt_tokens: int = 600
    observation_tokens: int = 150
    turns_mean: float = 4.0
    max_turns: int = 10
    decode_tokens_median: float = 250.0
    decode_tokens_sigma: float = 1.0
    max_decode_tokens: int = 4096
    think_time_mean_s: float = 1.5
    dapo_keep_first: float = 0.85
    """DAPO: fraction of groups with mixed rewards (kept) at the first step ..."""
    dapo_keep_last: float = 0.175
    """... and at the last step (1/5.7: the paper's largest per-step inflation)."""
    async_staleness: int = 1

    def __post_init__(self) -> None:
        _positive(steps=self.steps, group_size=self.group_size, batch=self.batch, turns_mean=self.turns_mean,
                  concurrency_per_worker=self.concurrency_per_worker, prompt_tokens=self.prompt_tokens,
                  max_turns=self.max_turns, decode_tokens_median=self.decode_tokens_median,
                  max_decode_tokens=self.max_decode_tokens, think_time_mean_s=self.think_time_mean_s)
        _fraction(dapo_keep_first=self.dapo_keep_first, dapo_keep_last=self.dapo_keep_last)
        if self.batch % self.group_size:
            raise ValueError("`batch` must be a multiple of `group_size`")
        if not self.algorithms:
            raise ValueError("`algorithms` must name at least one of grpo, dapo")
        if self.async_staleness < 1:
            raise ValueError("`async_staleness` must be >= 1 (fixed-async is the bounded-staleness baseline)")


class TrainerSpec(_Spec):
    flops_per_token_factor: float = 8.0
    """6 N D for forward+backward plus 2 N D for the old-policy log-probs."""
    mfu: float = 0.4

    def __post_init__(self) -> None:
        _positive(flops_per_token_factor=self.flops_per_token_factor)
        _fraction(mfu=self.mfu)


class WeightsSpec(_Spec):
    sparse_bytes_per_element: float = 0.3
    apply_s: float = 1.0
    sync_overhead_s: float = 2.0

    def __post_init__(self) -> None:
        _positive(sparse_bytes_per_element=self.sparse_bytes_per_element)


class ElasticSpec(_Spec):
    rose_activation_s: float = 5.0
    rose_revoke_mean_s: float = 0.0
    """Mean time until the serving owner takes a borrowed GPU back (0: never)."""
    rose_relend_s: float = 300.0
    """How long a revoked GPU stays with its owner before it is lent again."""
    spot_acquire_mean_s: float = 120.0
    spot_availability: float = 0.6
    spot_lifetime_mean_s: float = 3600.0
    spot_join_load_s: float = 20.0
    serverless_cold_start_mean_s: float = 30.0
    serverless_limit_s: float = 900.0

    def __post_init__(self) -> None:
        _positive(spot_acquire_mean_s=self.spot_acquire_mean_s, spot_lifetime_mean_s=self.spot_lifetime_mean_s,
                  serverless_cold_start_mean_s=self.serverless_cold_start_mean_s,
                  serverless_limit_s=self.serverless_limit_s)
        _fraction(spot_availability=self.spot_availability)
        if self.rose_revoke_mean_s < 0 or self.rose_relend_s < 0 or self.rose_activation_s < 0:
            raise ValueError("`rose_revoke_mean_s`, `rose_relend_s` and `rose_activation_s` must be >= 0")


class Scenario(_Spec):
    name: str = "custom"
    description: str = ""
    seed: int = 0
    systems: list[SystemName] = msgspec.field(
        default_factory=lambda: ["fixed", "fixed-async", "elastic-spot", "serverless", "rose", "rose-async"])
    gpu: GpuSpec = msgspec.field(default_factory=GpuSpec)
    rollout_model: ModelSpec = msgspec.field(default_factory=ModelSpec)
    serving: ServingSpec = msgspec.field(default_factory=ServingSpec)
    cluster: ClusterSpec = msgspec.field(default_factory=ClusterSpec)
    workload: WorkloadSpec = msgspec.field(default_factory=WorkloadSpec)
    trainer: TrainerSpec = msgspec.field(default_factory=TrainerSpec)
    weights: WeightsSpec = msgspec.field(default_factory=WeightsSpec)
    elastic: ElasticSpec = msgspec.field(default_factory=ElasticSpec)

    def __post_init__(self) -> None:
        if "rose" not in self.systems:
            raise ValueError("`systems` must include 'rose' (every ratio is rose against the others)")
        tp = self.rollout_model.tp
        if self.cluster.dedicated_rollout_gpus % tp or self.cluster.borrowable_gpus % tp:
            raise ValueError("`cluster.dedicated_rollout_gpus` and `borrowable_gpus` must be multiples of "
                             "`rollout_model.tp`")


def shipped_scenarios() -> list[str]:
    folder = resources.files("rose_core.app.sim").joinpath("scenarios")
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def load_scenario(name_or_path: str) -> Scenario:
    """A shipped scenario by name (``paper-8b``) or a TOML file path."""
    if name_or_path in shipped_scenarios():
        data = resources.files("rose_core.app.sim").joinpath("scenarios", f"{name_or_path}.toml").read_bytes()
        scenario = parse_toml(data, Scenario, name_or_path)
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ConfigError(f"no scenario {name_or_path!r}: give a TOML file or one of {', '.join(shipped_scenarios())}")
        scenario = parse_toml(path.read_bytes(), Scenario, str(path))
    if scenario.serving.traffic == "azure-csv" and not Path(scenario.serving.trace_csv).is_file():
        raise ConfigError(f"field `serving.trace_csv`: no such file {scenario.serving.trace_csv!r}")
    return scenario
