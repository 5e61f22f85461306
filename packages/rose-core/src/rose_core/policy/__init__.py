"""Pure co-serving policies: dual-SLO admission of rollout work and serving-first memory sharing."""

from rose_core.policy.dual_slack_admission import AdmissionConfig, AdmissionDecision, DualSlackAdmission
from rose_core.policy.latency_model import LatencyModel
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
    "DualSlackAdmission",
    "LatencyModel",
    "MemoryDecision",
    "MemoryPolicyConfig",
    "RolloutMemoryUse",
    "RolloutWork",
    "ServingFirstMemory",
    "ServingRequest",
]
