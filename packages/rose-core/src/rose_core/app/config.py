"""Configuration of a ROSE job: msgspec Structs decoded from TOML with errors that name the field.

Every default is visible with `rose config show`. Validation raises ``ValueError`` in ``__post_init__``
(the validators of ``rose_core.config.sections``); msgspec turns that into an error that carries the field's
path, and ``load_config`` (``config_support.load_toml``) turns it into one line for the user.
"""

from __future__ import annotations

import math
import os
from typing import Any

import msgspec

from rose_core.config.sections import (
    ConfigSection,
    load_toml,
    require_entry_point_name,
    require_fraction,
    require_non_negative,
    require_port,
    require_positive,
)
from rose_core.scheduler.scheduler_config import SchedulerConfig

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
    "LoadConfig",
    "ModelConfig",
    "RLConfig",
    "RunConfig",
    "SchedulerConfig",
    "SloConfig",
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


class SloConfig(ConfigSection):
    ttft_ms: float = 2000.0
    tpot_ms: float = 400.0
    headroom_fraction: float = 0.8
    """A serving executor lends capacity only while its p99s stay under this fraction of the SLO."""

    def __post_init__(self) -> None:
        require_positive(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms)
        require_fraction(headroom_fraction=self.headroom_fraction)


LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
"""How per-token losses become one number (``docs/rl.md``): over all tokens; per sample (turn) then over samples;
per-sample sums over a constant length (Dr. GRPO) then over samples."""


class AlgorithmPreset(msgspec.Struct, frozen=True):
    """What ``rl.algorithm`` fills into the fields left at 0 / empty."""

    clip_low: float
    clip_high: float
    loss_agg: str
    dynamic_sampling: bool = False


ALGORITHMS = {
    "grpo": AlgorithmPreset(clip_low=0.2, clip_high=0.2, loss_agg="seq_mean_token_mean"),
    "dapo": AlgorithmPreset(clip_low=0.2, clip_high=0.28, loss_agg="token_mean", dynamic_sampling=True),
}
"""GRPO as published (symmetric clip, per-sequence mean) and DAPO (decoupled clip-higher, token-level mean,
dynamic sampling)."""


def validate_policy_loss(*, clip_low: float, clip_high: float, loss_agg: str, kl_coef: float, tis_cap: float) -> None:
    """``ValueError`` naming the first policy-loss setting out of range (shared by ``RLConfig`` and the trainer)."""
    if not 0.0 < clip_low < 1.0:
        raise ValueError(f"`clip_low` {clip_low} must be in (0, 1): the ratio's floor is 1 - clip_low")
    if not (math.isfinite(clip_high) and clip_high >= clip_low):
        raise ValueError(
            f"`clip_high` {clip_high} must be >= `clip_low` {clip_low} (DAPO's clip-higher: e.g. 0.2 / 0.28)"
        )
    if loss_agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"`loss_agg` {loss_agg!r} is not one of {list(LOSS_AGGREGATIONS)}")
    if not (math.isfinite(kl_coef) and kl_coef >= 0.0):
        raise ValueError(f"`kl_coef` {kl_coef} must be >= 0 (0: no reference model)")
    if not (math.isfinite(tis_cap) and tis_cap >= 1.0):
        raise ValueError(f"`tis_cap` {tis_cap} must be >= 1 (a cap below 1 would down-weight on-policy tokens)")


EXTERNAL_TRAINER = "external"
TRAINERS = ("reference", EXTERNAL_TRAINER)


class RLConfig(ConfigSection):
    """The RL job. The defaults are the README demo's, chosen so that it visibly learns within a few minutes
    on 2 cores (`tools/learning_sweep.py`, `docs/rl_sweep.md`; measured live: `docs/rl.md`)."""

    steps: int = 18
    prompts_per_step: int = 3
    group_size: int = 4
    max_turns: int = 4
    max_tokens_per_turn: int = 8
    max_context_tokens: int = 512
    temperature: float = 1.0
    lr: float = 3e-3
    epochs: int = 2
    env_size: int = 4
    seed: int = 0
    turn_timeout_s: float = 120.0
    weight_sync_timeout_s: float = 120.0
    algorithm: str = "dapo"
    """``grpo`` or ``dapo``: the defaults of ``clip_low``, ``clip_high`` and ``loss_agg`` (``ALGORITHMS``)."""
    clip_low: float = 0.0
    """PPO clip below: the ratio new/proximal is kept >= 1 - clip_low. 0: the algorithm's (0.2)."""
    clip_high: float = 0.0
    """PPO clip above: the ratio is kept <= 1 + clip_high. 0: the algorithm's (grpo 0.2, dapo 0.28)."""
    loss_agg: str = ""
    """One of ``LOSS_AGGREGATIONS``. Empty: the algorithm's (grpo ``seq_mean_token_mean``, dapo ``token_mean``)."""
    advantage_std_norm: bool = True
    """Divide group-centred rewards by the group's std (GRPO, DAPO); false for Dr. GRPO."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to a frozen copy of the initial policy, per token; 0: no reference model."""
    tis_cap: float = 2.0
    """Cap of the truncated importance weight proximal/behaviour that corrects turns sampled on older weights."""
    overlong_buffer_tokens: int = 0
    """DAPO's soft overlong punishment, per turn: a turn within this many tokens of ``max_tokens_per_turn`` is
    penalised linearly up to ``overlong_penalty``. 0: off."""
    overlong_penalty: float = 1.0
    """The penalty of a turn that reaches ``max_tokens_per_turn`` (with ``overlong_buffer_tokens`` > 0)."""
    dynamic_sampling: bool | None = None
    """DAPO's dynamic sampling: drop groups whose rewards are all equal (no gradient) and roll out new groups
    in their place, at most ``max_refill_rounds`` times a step. None: the algorithm's (dapo on, grpo off)."""
    max_refill_rounds: int = 2
    """Refill rounds of dynamic sampling per step (the step trains on what it has after the last)."""
    eval_every: int = 6
    """Every this many steps, play ``eval_maps`` held-out maps greedily (temperature 0) beside the step's
    rollout and report ``eval_success``. 0: never."""
    eval_maps: int = 8
    """Held-out maps per evaluation (their seeds never occur in training)."""
    checkpoint_every: int = 0
    """Every this many steps (and after the last), write a checkpoint (policy, optimizer, step, RNG, weight
    version) under ``checkpoint_dir``. 0: never."""
    checkpoint_dir: str = ""
    """Where checkpoints go; empty: ``<run_dir>/checkpoints``."""
    checkpoint_keep: int = 3
    """Complete checkpoints kept (older ones are deleted once a new one is written)."""
    env: str = "frozenlake"
    """The environment played: a built-in (``frozenlake``), a ``rose.environments`` entry point of an
    installed package (``rose_core.app.rl.environments.registry``; resolved when the job starts), or ``gateway``: agents
    bring their own turns through the rollout gateway (``[gateway]``)."""
    trainer: str = "reference"
    """Who trains: ``reference`` (ROSE's trainer, in the controller's process) or ``external`` (your trainer
    pulls each step's batch from the trainer API and publishes the next version itself; docs/gateway.md,
    "External trainers")."""
    trainer_ranks: int = 1
    """External trainers: the tensor-parallel ranks that each publish their shard of a version."""
    trainer_timeout_s: float = 1800.0
    """External trainers: a step whose next version has not been published by then fails the run."""

    def __post_init__(self) -> None:
        require_positive(
            steps=self.steps,
            prompts_per_step=self.prompts_per_step,
            group_size=self.group_size,
            max_turns=self.max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn,
            lr=self.lr,
            epochs=self.epochs,
            max_context_tokens=self.max_context_tokens,
            env_size=self.env_size,
            turn_timeout_s=self.turn_timeout_s,
            weight_sync_timeout_s=self.weight_sync_timeout_s,
        )
        require_non_negative(temperature=self.temperature)
        if self.group_size < 2:
            raise ValueError("`group_size` must be >= 2 (GRPO normalises rewards within a group)")
        self._apply_algorithm()
        validate_policy_loss(
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            loss_agg=self.loss_agg,
            kl_coef=self.kl_coef,
            tis_cap=self.tis_cap,
        )
        self._check_overlong()
        require_non_negative(max_refill_rounds=self.max_refill_rounds, eval_every=self.eval_every,
                             checkpoint_every=self.checkpoint_every)
        require_positive(eval_maps=self.eval_maps, checkpoint_keep=self.checkpoint_keep,
                         trainer_ranks=self.trainer_ranks, trainer_timeout_s=self.trainer_timeout_s)
        if self.trainer not in TRAINERS:
            raise ValueError(f"`trainer` {self.trainer!r} is not one of {list(TRAINERS)}")
        if self.trainer == EXTERNAL_TRAINER and self.checkpoint_every:
            raise ValueError("`checkpoint_every` needs ROSE's trainer: an external trainer checkpoints itself "
                             "(set it to 0)")
        require_entry_point_name(env=self.env)

    def _apply_algorithm(self) -> None:
        preset = ALGORITHMS.get(self.algorithm)
        if preset is None:
            raise ValueError(f"`algorithm` {self.algorithm!r} is not one of {list(ALGORITHMS)}")
        self.clip_low = self.clip_low or preset.clip_low
        self.clip_high = self.clip_high or preset.clip_high
        self.loss_agg = self.loss_agg or preset.loss_agg
        if self.dynamic_sampling is None:
            self.dynamic_sampling = preset.dynamic_sampling

    def _check_overlong(self) -> None:
        require_non_negative(overlong_buffer_tokens=self.overlong_buffer_tokens, overlong_penalty=self.overlong_penalty)
        if self.overlong_buffer_tokens > self.max_tokens_per_turn:
            raise ValueError(
                f"`overlong_buffer_tokens` {self.overlong_buffer_tokens} must be <= `max_tokens_per_turn` "
                f"{self.max_tokens_per_turn}: the buffer is the last part of a turn's token budget"
            )


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

    def __post_init__(self) -> None:
        require_port(port=self.port)
        require_positive(turn_timeout_s=self.turn_timeout_s)
        require_non_negative(step_timeout_s=self.step_timeout_s)


class ExecutorsConfig(ConfigSection):
    """The executors `rose run` starts on this machine."""

    dedicated: int = 1
    serving: int = 1
    kv_cache_gib: float = 1.0
    rollout_capacity: int = 4
    """Concurrent turns per executor: small, so one dedicated executor saturates and the borrowed one helps."""
    start_timeout_s: float = 300.0
    serving_overrides: dict[str, Any] = msgspec.field(default_factory=dict)
    """Fields of the serving executors' `rose-executor` config (docs/executor.md), over `rose run`'s own,
    e.g. ``memory_high_watermark`` or ``revoke_after_pressure_s``; the executor validates them."""
    dedicated_overrides: dict[str, Any] = msgspec.field(default_factory=dict)
    """The same for the dedicated executors."""

    def __post_init__(self) -> None:
        if self.dedicated < 0 or self.serving < 0 or self.dedicated + self.serving == 0:
            raise ValueError("need at least one executor (`dedicated` + `serving` >= 1)")
        require_positive(kv_cache_gib=self.kv_cache_gib, rollout_capacity=self.rollout_capacity,
                         start_timeout_s=self.start_timeout_s)


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
    slo: SloConfig = msgspec.field(default_factory=SloConfig)
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
    return RunConfig() if path is None else load_toml(path, RunConfig)
