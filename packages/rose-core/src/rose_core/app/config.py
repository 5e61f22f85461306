"""Configuration of a ROSE job: msgspec Structs decoded from TOML with errors that name the field.

Every default is visible with `rose config show`. Validation raises ``ValueError`` in ``__post_init__``
(the validators of ``rose_core.config.sections``); msgspec turns that into an error that carries the field's
path, and ``load_config`` (``config_support.load_toml``) turns it into one line for the user.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from rose_core.app.rl_config import (
    ALGORITHMS,
    EXTERNAL_TRAINER,
    LOSS_AGGREGATIONS,
    RL_MOVED,
    AlgorithmPreset,
    RLConfig,
    validate_policy_loss,
)
from rose_core.config.sections import (
    ConfigSection,
    load_toml,
    require_fraction,
    require_non_negative,
    require_port,
    require_positive,
)
from rose_core.config.slo import JobSlo
from rose_core.scheduler.scheduler_config import SchedulerConfig
from rose_core.support.cpu_list import check_cores_setting

__all__ = [
    "ALGORITHMS",
    "EXTERNAL_TRAINER",
    "GATEWAY_ENV",
    "LOSS_AGGREGATIONS",
    "AlgorithmPreset",
    "ClusterConfig",
    "ConfigSection",
    "ControllerConfig",
    "ExecutorsConfig",
    "GatewayConfig",
    "JobSlo",
    "LoadConfig",
    "ModelConfig",
    "RLConfig",
    "RunConfig",
    "SchedulerConfig",
    "load_config",
    "require_fraction",
    "require_positive",
    "validate_policy_loss",
]

class ControllerConfig(ConfigSection):
    host: str = "127.0.0.1"
    port: int = 0
    """Control port; 0 picks a free one."""
    metrics_port: int = 0
    encrypt: bool = False
    """Encrypt the control socket (CurveZMQ; keys derived from the secret, docs/security.md). `rose run` tells
    the executors it starts; executors started elsewhere need `encrypt_control = true`, `rose-tui` `--encrypt`."""
    weights_port: int = 0
    """The weight publisher's port; 0 picks a free one. Fix it when a `rose-transfer relay` in another cluster
    pulls from the publisher (its ``--upstream tcp://<host>:<weights_port>``)."""
    weights_tls: bool = False
    """Encrypt the weight links (TLS 1.3, the server key derived from the secret, no certificate files): the
    publisher serves ``tls://``, every relay of it too, and receivers pin the key (docs/security.md). A
    `rose-transfer relay` then takes ``--upstream tls://<host>:<weights_port>``. UCX links stay unencrypted."""
    heartbeat_interval_s: float = 1.0
    stall_timeout_s: float = 2.0
    status_interval_s: float = 0.5
    turn_timeout_s: float = 600.0
    """A turn assigned longer than this to an executor that still heartbeats (held by its guard, or stuck) is
    re-routed and cancelled there; 0: no bound."""

    def __post_init__(self) -> None:
        require_positive(heartbeat_interval_s=self.heartbeat_interval_s, stall_timeout_s=self.stall_timeout_s,
                         status_interval_s=self.status_interval_s)
        require_non_negative(turn_timeout_s=self.turn_timeout_s)
        require_port(port=self.port, metrics_port=self.metrics_port, weights_port=self.weights_port)
        if self.stall_timeout_s <= self.heartbeat_interval_s:
            raise ValueError("`stall_timeout_s` must exceed `heartbeat_interval_s`")


class LoadConfig(ConfigSection):
    """The built-in bursty production traffic against the serving endpoint."""

    enabled: bool = True
    base_rps: float = 1.0
    burst_rps: float = 6.0
    mean_calm_s: float = 4.0
    mean_burst_s: float = 1.5
    prompt_tokens: int = 48
    max_tokens: int = 16
    max_in_flight: int = 8
    seed: int = 1
    endpoint_shares: list[float] = []
    """Share of the arrivals per serving executor, in the order of their ids (``serving-0``, ``serving-1``, ...);
    empty: equal shares."""

    def __post_init__(self) -> None:
        require_positive(base_rps=self.base_rps, burst_rps=self.burst_rps, max_in_flight=self.max_in_flight,
                         mean_calm_s=self.mean_calm_s, mean_burst_s=self.mean_burst_s,
                         prompt_tokens=self.prompt_tokens, max_tokens=self.max_tokens)
        if any(s < 0 for s in self.endpoint_shares) or (self.endpoint_shares and sum(self.endpoint_shares) <= 0):
            raise ValueError("`endpoint_shares` must be >= 0 with a positive sum (one per serving executor)")


GATEWAY_ENV = "gateway"
"""``rl.env`` (or ``rose run --env gateway``): no built-in environment; agents bring their turns through the
rollout gateway (``[gateway]``, ``docs/gateway.md``)."""


class GatewayConfig(ConfigSection):
    """The rollout gateway (``rl.env = "gateway"``): an OpenAI-compatible HTTP endpoint per session."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free one (printed: ``gateway http://HOST:PORT key-file PATH``)."""
    key_file: str = ""
    """The bearer key clients send (``api_key``); empty: a new one in ``<run_dir>/gateway.key``; an existing
    file is used as it is."""
    turn_timeout_s: float = 600.0
    """A call whose turn has not finished by then gets a 504 (its prompt tokens are taken back)."""
    step_timeout_s: float = 0.0
    """A step that has not collected ``rl.prompts_per_step`` complete groups by then fails the run; 0: wait."""
    tool_parser: str = ""
    """vLLM's tool-call parser for the policy's replies, by the name ``vllm serve --tool-call-parser`` takes
    (``hermes`` for Qwen2.5-style ``<tool_call>`` tags, ``llama3_json``, ``mistral``...): replies then carry
    ``tool_calls`` and ``finish_reason = "tool_calls"``; empty: replies are text. Needs vLLM on the gateway's host."""
    reasoning_parser: str = ""
    """vLLM's reasoning parser (``vllm serve --reasoning-parser``: ``deepseek_r1``, ``qwen3``...): replies then
    carry ``reasoning`` apart from ``content``; empty: none."""
    max_connections: int = 256
    """Connections served at once, by the gateway and by the trainer API each (a thread each); more get a 503."""
    idle_timeout_s: float = 30.0
    """The longest a connection may wait between a client's bytes (headers, body, the next keep-alive request)."""
    max_sessions: int = 10_000
    """Sessions held at once (open, or closed in a group not trained on yet); more get a 429."""
    max_metadata_bytes: int = 16384
    """A session's metadata, as JSON; more gets a 413."""
    max_calls_per_session: int = 1000
    """Calls (turns) per session; more get a 429."""
    session_idle_s: float = 3600.0
    """A group none of whose sessions was used for this long is dropped (its sessions then answer 404)."""

    def __post_init__(self) -> None:
        require_port(port=self.port)
        require_positive(turn_timeout_s=self.turn_timeout_s, max_connections=self.max_connections,
                         idle_timeout_s=self.idle_timeout_s, max_sessions=self.max_sessions,
                         max_metadata_bytes=self.max_metadata_bytes, max_calls_per_session=self.max_calls_per_session,
                         session_idle_s=self.session_idle_s)
        require_non_negative(step_timeout_s=self.step_timeout_s)


class ExecutorsConfig(ConfigSection):
    """The executors `rose run` starts on this machine."""

    dedicated: int = 1
    serving: int = 1
    kv_cache_gib: float = 1.0
    rollout_capacity: int = 4
    """Concurrent turns per executor: small, so one dedicated executor saturates and the borrowed one helps."""
    start_timeout_s: float = 300.0
    serving_cores: str = "auto"
    """The cores of the serving executors (production engine, rollout engine, guard), kept apart from the job's
    (this process, the dedicated executors): ``auto`` (the last half of the cores `rose run` may use, when it
    may use two or more), ``none`` (every process on every core), or a CPU list (``"3"``, ``"4-7"``); local
    executors only (Ray places its actors). ``rose_core.app.run.core_split``."""
    serving_overrides: dict[str, Any] = msgspec.field(default_factory=dict)
    """Settings of the serving executors' `rose-executor` config over `rose run`'s own, in its layout (a table per
    section, docs/executor.md), e.g. ``{ memory = { high_watermark = 0.2 }, slo = { revoke_after_pressure_s = 5 } }``;
    checked against the executor's schema when the executors start."""
    dedicated_overrides: dict[str, Any] = msgspec.field(default_factory=dict)
    """The same for the dedicated executors."""

    def __post_init__(self) -> None:
        if self.dedicated < 0 or self.serving < 0 or self.dedicated + self.serving == 0:
            raise ValueError("need at least one executor (`dedicated` + `serving` >= 1)")
        require_positive(kv_cache_gib=self.kv_cache_gib, rollout_capacity=self.rollout_capacity,
                         start_timeout_s=self.start_timeout_s)
        check_cores_setting(self.serving_cores)


class ModelConfig(ConfigSection):
    """The models of the job: local Hugging Face directories (config.json, safetensors weights, tokenizer;
    ``docs/controller.md``, "Your own models"); checked when the job starts (``rose_core.app.rl.demo.model_dirs``)."""

    policy: str = ""
    """The policy that is trained and rolled out; empty: the generated tiny Llama under ``models_dir``."""
    serving: str = ""
    """The production model of the serving executors; empty: the generated tiny Qwen2 under ``models_dir``."""


RELAY_START = "start"
RELAY_NONE = "none"
TRANSPORTS = ("tcp", "ucx")


class ClusterConfig(ConfigSection):
    """Executors that sit behind one link from the trainer's cluster (weights cross it once per version).

    ``relay``: ``"start"`` (`rose run` starts a relay for this cluster and its executors pull through it),
    a ``tcp://host:port``, ``tls://host:port`` or ``ucx://host:port`` relay already running there
    (`rose-transfer relay`), or
    ``"none"``. ``transport``: how this cluster's executors reach a started relay (``tcp`` or ``ucx``).
    Executors in no cluster sit with the trainer and pull from the publisher directly."""

    name: str = ""
    executors: list[str] = msgspec.field(default_factory=list)
    relay: str = RELAY_START
    transport: str = "tcp"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("every cluster needs a `name`")
        if not self.executors:
            raise ValueError(f"cluster {self.name!r} lists no `executors` (ids such as \"serving-0\")")
        if self.relay not in (RELAY_START, RELAY_NONE) and not self.relay.startswith(("tcp://", "tls://", "ucx://")):
            raise ValueError(
                f"cluster {self.name!r}: `relay` is \"start\", \"none\" or a tcp:// / tls:// / ucx:// address"
            )
        if self.transport not in TRANSPORTS:
            raise ValueError(f"cluster {self.name!r}: `transport` is one of {list(TRANSPORTS)}")


class RayConfig(ConfigSection):
    """`rose run --ray ADDRESS`: the executors as Ray actors of an existing Ray cluster, placed by resources
    (docs/deploy.md). Control and weights still travel over ROSE's own channels; Ray places and supervises."""

    address: str = ""
    """The Ray cluster (``HOST:PORT`` of its head, or ``auto``); empty: executors are local processes."""
    namespace: str = "rose"
    serving_resource: str = "rose_serving_gpu"
    """The custom resource the serving fleet's operator puts on serving nodes, one unit per GPU; a serving
    executor takes one unit, so Ray's own accounting lets at most one RL job borrow each serving GPU."""
    dedicated_cpus: float = 1.0
    """CPUs a dedicated executor's actor asks for (the embedded case)."""
    dedicated_gpus: float = 0.0
    """GPUs a dedicated executor's actor asks for (a GPU cluster: 1, or the engine's tensor-parallel size)."""
    placement_timeout_s: float = 120.0
    """How long an executor may wait for its resources (another job holding every serving unit) before the
    run stops with an error that names the resource and who holds it."""

    def __post_init__(self) -> None:
        require_non_negative(dedicated_cpus=self.dedicated_cpus, dedicated_gpus=self.dedicated_gpus)
        require_positive(placement_timeout_s=self.placement_timeout_s)
        if not self.serving_resource:
            raise ValueError("`serving_resource` names the custom resource on serving nodes (e.g. rose_serving_gpu)")


class RunConfig(ConfigSection):
    controller: ControllerConfig = msgspec.field(default_factory=ControllerConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    slo: JobSlo = msgspec.field(default_factory=JobSlo)
    rl: RLConfig = msgspec.field(default_factory=RLConfig)
    load: LoadConfig = msgspec.field(default_factory=LoadConfig)
    executors: ExecutorsConfig = msgspec.field(default_factory=ExecutorsConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    gateway: GatewayConfig = msgspec.field(default_factory=GatewayConfig)
    ray: RayConfig = msgspec.field(default_factory=RayConfig)
    weight_publisher: str = "sparse"
    """Weight data plane from the `rose.weight_publishers` entry points: `sparse` (patches against the receiver's version) or `dense`."""
    models_dir: str = ".rose/models"
    """Where the tiny demo models are generated (once, then cached) for the `[model]` fields left empty."""
    run_dir: str = ".rose/run"
    clusters: list[ClusterConfig] = msgspec.field(default_factory=list)
    """Where the executors sit (`[[clusters]]`); executors in none sit with the trainer."""

    def __post_init__(self) -> None:
        known = {f"dedicated-{i}" for i in range(self.executors.dedicated)}
        known |= {f"serving-{i}" for i in range(self.executors.serving)}
        placed: dict[str, str] = {}
        for cluster in self.clusters:
            for executor in cluster.executors:
                if executor not in known:
                    raise ValueError(f"cluster {cluster.name!r} lists {executor!r}: this job runs {sorted(known)}")
                if executor in placed:
                    raise ValueError(f"{executor!r} is in clusters {placed[executor]!r} and {cluster.name!r}: pick one")
                placed[executor] = cluster.name
        names = [c.name for c in self.clusters]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster names repeat: {names}")


def load_config(path: str | os.PathLike[str] | None) -> RunConfig:
    """The job config in ``path`` (TOML) over the defaults; ``None`` gives the defaults."""
    return RunConfig() if path is None else load_toml(path, RunConfig, moved=RL_MOVED)
