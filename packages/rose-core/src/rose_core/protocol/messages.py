"""Every message that crosses a process boundary in ROSE, and the unions each channel decodes.

The messages are defined by channel in ``control_messages`` (controller <-> executors, and the handshake),
``weight_messages`` (rose-transfer) and ``status_messages`` (controller -> dashboards), over ``message_base``;
import them from here.

Rules (read before editing):
- Fields are only ever APPENDED, each new one with a default. Never reorder, rename or remove a field,
  and never change a field's type: peers on older versions must keep decoding what newer ones send.
- A change that cannot follow that rule bumps ``PROTOCOL_VERSION``; peers with another version are
  rejected at the frame envelope with a message that names the fix.
- Every message is a tagged ``msgspec.Struct`` (``type`` field) in one union per channel direction.
- Bulk arrays (numpy) are typed ``np.ndarray`` and travel as extra zero-copy frames (see ``serde``).
"""

from __future__ import annotations

from typing import Union

from rose_core.protocol.control_messages import (
    CancelTurn,
    ErrorReport,
    Goodbye,
    Heartbeat,
    Hello,
    LoadReport,
    ModelInfo,
    Register,
    Release,
    SamplingParams,
    Shutdown,
    StepStarted,
    TurnAborted,
    TurnRequest,
    TurnResult,
    WeightAnnounce,
    WeightApplied,
    Welcome,
)
from rose_core.protocol.message_base import PROTOCOL_VERSION, Message, PeerKind, Role
from rose_core.protocol.status_messages import (
    STATUS_CREDIT,
    ExecutorStatus,
    StatusAck,
    StatusSnapshot,
    StepStatus,
)
from rose_core.protocol.weight_messages import (
    BucketData,
    BucketInfo,
    FetchBucket,
    FetchManifest,
    ShardAccepted,
    ShardOffer,
    ShardPart,
    ShardView,
    TensorEntry,
    WeightManifest,
)

# ---------------------------------------------------------------- channel unions

ToController = Union[
    Hello, Register, Heartbeat, TurnResult, TurnAborted, WeightApplied, ErrorReport, Goodbye, StatusAck
]
FromController = Union[
    Welcome, TurnRequest, CancelTurn, WeightAnnounce, StepStarted, StatusSnapshot, Shutdown, Release, ErrorReport
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
    "Message",
    "ModelInfo",
    "PeerKind",
    "Register",
    "Release",
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
