"""What the controller counts over a job: turns by pool, re-routes and why, late and refused results, turns
given up, retired executors and those that left."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ControllerStats:
    late_results: int = 0
    reroutes: int = 0
    overdue: int = 0
    """Turns re-routed because they ran over ``turn_timeout_s`` on an executor that still heartbeats."""
    held_moved: int = 0
    """Turns a borrowed serving executor's guard held back, moved to dedicated executors with room
    (``scheduler.move_held_after_s``)."""
    turns_by_role: dict[str, int] = field(default_factory=lambda: {"dedicated": 0, "serving": 0})
    prompt_tokens_by_role: dict[str, int] = field(default_factory=lambda: {"dedicated": 0, "serving": 0})
    prefix_hit_tokens_by_role: dict[str, int] = field(default_factory=lambda: {"dedicated": 0, "serving": 0})
    refused_results: dict[str, int] = field(default_factory=dict)
    """Results refused by ``result_check``, by reason."""
    turns_given_up: int = 0
    """Turns that failed on executors more often than ``scheduler.turn_retries`` allows (trajectories dropped)."""
    retired: dict[str, str] = field(default_factory=dict)
    """Executors taken out of the job, and why."""
    left: dict[str, str] = field(default_factory=dict)
    """Executors that ended their lease with the job before it released them (Goodbye), and why: a serving
    host revoked by its operator, one whose rollout engine died, a dedicated executor stopped."""

    def prefix_hit_ratio(self, role: str) -> float:
        """Accepted turns' prompt tokens served from the prefix cache, in ``role``'s pool."""
        prompt = self.prompt_tokens_by_role.get(role, 0)
        return self.prefix_hit_tokens_by_role.get(role, 0) / prompt if prompt else 0.0

    def count_accepted(self, role: str, prompt_tokens: int, prefix_hit_tokens: int) -> None:
        self.turns_by_role[role] = self.turns_by_role.get(role, 0) + 1
        self.prompt_tokens_by_role[role] = self.prompt_tokens_by_role.get(role, 0) + prompt_tokens
        self.prefix_hit_tokens_by_role[role] = (
            self.prefix_hit_tokens_by_role.get(role, 0) + min(prefix_hit_tokens, prompt_tokens))
