"""Configuration of a ROSE job: msgspec Structs decoded from TOML with errors that name the field.

Every default is visible with `rose config show`. Validation raises ``ValueError`` in ``__post_init__``;
msgspec turns that into an error that carries the field's path, and ``load_config`` turns it into one
line for the user.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from rose_core.errors import ConfigError

T = TypeVar("T")


class ConfigSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every TOML config section: keyword-only, unknown fields rejected."""


_Section = ConfigSection


def require_positive(**values: float) -> None:
    """``ValueError`` naming the first value that is not > 0 (msgspec adds the field's path)."""
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"`{name}` must be > 0 (got {value})")


def require_fraction(**values: float) -> None:
    """``ValueError`` naming the first value outside (0, 1]."""
    for name, value in values.items():
        if not 0 < value <= 1:
            raise ValueError(f"`{name}` must be in (0, 1] (got {value})")


_positive = require_positive


class ControllerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 0
    """Control port; 0 picks a free one."""
    metrics_port: int = 0
    heartbeat_interval_s: float = 1.0
    stall_timeout_s: float = 2.0
    status_interval_s: float = 0.5

    def __post_init__(self) -> None:
        _positive(heartbeat_interval_s=self.heartbeat_interval_s, stall_timeout_s=self.stall_timeout_s)
        if not 0 <= self.port < 65536:
            raise ValueError(f"`port` must be in 0..65535 (got {self.port})")
        if self.stall_timeout_s <= self.heartbeat_interval_s:
            raise ValueError("`stall_timeout_s` must exceed `heartbeat_interval_s`")


class SchedulerConfig(_Section):
    max_concurrency_per_worker: int = 16
    max_borrowed_workers: int = 16
    staleness: int = 0
    """Weight versions a turn may lag behind the newest (0 = synchronous GRPO)."""
    queue_scan_limit: int = 256

    def __post_init__(self) -> None:
        _positive(max_concurrency_per_worker=self.max_concurrency_per_worker, queue_scan_limit=self.queue_scan_limit)
        if self.staleness < 0 or self.max_borrowed_workers < 0:
            raise ValueError("`staleness` and `max_borrowed_workers` must be >= 0")


class SloConfig(_Section):
    ttft_ms: float = 2000.0
    tpot_ms: float = 400.0
    headroom_fraction: float = 0.8
    """A serving executor lends capacity only while its p99s stay under this fraction of the SLO."""

    def __post_init__(self) -> None:
        _positive(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms)
        if not 0 < self.headroom_fraction <= 1:
            raise ValueError("`headroom_fraction` must be in (0, 1]")


class RLConfig(_Section):
    steps: int = 3
    prompts_per_step: int = 3
    group_size: int = 4
    max_turns: int = 4
    max_tokens_per_turn: int = 8
    max_context_tokens: int = 512
    temperature: float = 1.0
    lr: float = 1e-3
    clip_eps: float = 0.2
    epochs: int = 2
    env_size: int = 4
    seed: int = 0
    turn_timeout_s: float = 120.0
    weight_sync_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        _positive(
            steps=self.steps,
            prompts_per_step=self.prompts_per_step,
            group_size=self.group_size,
            max_turns=self.max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn,
            lr=self.lr,
            epochs=self.epochs,
        )
        if self.group_size < 2:
            raise ValueError("`group_size` must be >= 2 (GRPO normalises rewards within a group)")


class LoadConfig(_Section):
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

    def __post_init__(self) -> None:
        _positive(base_rps=self.base_rps, burst_rps=self.burst_rps, max_in_flight=self.max_in_flight)


class ExecutorsConfig(_Section):
    """The executors `rose run` starts on this machine."""

    dedicated: int = 1
    serving: int = 1
    kv_cache_gib: float = 1.0
    rollout_capacity: int = 4
    """Concurrent turns per executor: small, so one dedicated executor saturates and the borrowed one helps."""
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.dedicated < 0 or self.serving < 0 or self.dedicated + self.serving == 0:
            raise ValueError("need at least one executor (`dedicated` + `serving` >= 1)")
        _positive(kv_cache_gib=self.kv_cache_gib, rollout_capacity=self.rollout_capacity)


class RunConfig(_Section):
    controller: ControllerConfig = msgspec.field(default_factory=ControllerConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    slo: SloConfig = msgspec.field(default_factory=SloConfig)
    rl: RLConfig = msgspec.field(default_factory=RLConfig)
    load: LoadConfig = msgspec.field(default_factory=LoadConfig)
    executors: ExecutorsConfig = msgspec.field(default_factory=ExecutorsConfig)
    weight_publisher: str = "sparse"
    """Weight data plane from the `rose.weight_publishers` entry points: `sparse` (patches against the receiver's version) or `dense`."""
    models_dir: str = ".rose/models"
    run_dir: str = ".rose/run"


def load_config(path: str | os.PathLike[str] | None) -> RunConfig:
    """The job config in ``path`` (TOML) over the defaults; ``None`` gives the defaults."""
    return RunConfig() if path is None else load_toml(path, RunConfig)


def load_toml(path: str | os.PathLike[str], type_: type[T]) -> T:
    """Any config Struct from a TOML file, with one-line errors naming the field."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    return parse_config(data, type_, str(path))


def parse_config(
    data: bytes | str, type_: type[T], source: str = "config", hint: str = "`rose config show` lists every field"
) -> T:
    """Decode TOML into ``type_``; any problem is a one-line ``ConfigError`` naming the field (and ``hint``)."""
    try:
        return msgspec.toml.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        suffix = f"; {hint}" if hint else ""
        raise ConfigError(f"{source}: {_humanize(str(exc))}{suffix}") from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc


def _humanize(message: str) -> str:
    text, _, where = message.partition(" - at `$")
    field = where.rstrip("`").lstrip(".")
    return f"field `{field}`: {text}" if field else text


def dump_config(config: Any) -> str:
    return msgspec.toml.encode(config).decode()
