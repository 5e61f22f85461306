"""Pure co-serving policies: the co-serving guard (dual-SLO admission of rollout work) and serving-first memory."""

from rose_core.policy.co_serving_guard import (
    CoServingGuard,
    GuardSettings,
    GuardVerdict,
    QueuedTurn,
    SloBudgets,
    hold_margin_s,
)
from rose_core.policy.dual_slack_admission import AdmissionConfig, AdmissionDecision, DualSlackAdmission
from rose_core.policy.latency_model import LatencyModel
from rose_core.policy.live_request import LiveRequest
from rose_core.policy.serving_first_memory import (
    MemoryDecision,
    MemoryPolicyConfig,
    RolloutMemoryUse,
    ServingFirstMemory,
)
from rose_core.policy.serving_request import RolloutWork, ServingRequest

__all__ = [
    "AdmissionConfig",
    "AdmissionDecision",
    "CoServingGuard",
    "DualSlackAdmission",
    "GuardSettings",
    "GuardVerdict",
    "LatencyModel",
    "LiveRequest",
    "MemoryDecision",
    "MemoryPolicyConfig",
    "QueuedTurn",
    "RolloutMemoryUse",
    "RolloutWork",
    "ServingFirstMemory",
    "ServingRequest",
    "SloBudgets",
    "hold_margin_s",
]
