"""One trajectory in progress: an environment's episode (``rose_core.app.rl.environments.environment.Environment``), its token
conversation and the turns it produced.

Pure and clock-free: the caller samples each prompt wherever it likes and hands back the tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from rose_core.app.rl.algorithm.trajectory import Trajectory, Turn
from rose_core.app.rl.environments.codec import TextCodec
from rose_core.app.rl.environments.conversation import Conversation
from rose_core.app.rl.environments.environment import Environment, StepOutcome


class Episode:
    """Drives ``env`` turn by turn: ``prompt()`` -> sample -> ``advance(...)`` until ``done``."""

    __slots__ = ("_codec", "_conversation", "_env", "_pending", "trajectory")

    def __init__(
        self,
        trajectory_id: str,
        group_id: str,
        env: Environment,
        codec: TextCodec,
        max_prompt_tokens: int = 1024,
    ) -> None:
        self._env = env
        self._codec = codec
        self.trajectory = Trajectory(trajectory_id=trajectory_id, group_id=group_id, env_seed=env.seed)
        first = env.reset()
        header = ([codec.bos_id] if codec.bos_id is not None else []) + codec.encode(env.header)
        self._conversation = Conversation(header=tuple(header), max_prompt_tokens=max_prompt_tokens)
        self._conversation.add_observation(codec.encode(first[len(env.header) :]))
        self._pending: list[int] | None = None

    @property
    def done(self) -> bool:
        return self.trajectory.done

    def prompt(self) -> list[int]:
        """The prompt token ids of the next turn (the same list until ``advance`` is called)."""
        if self.done:
            raise ValueError(f"trajectory {self.trajectory.trajectory_id} is done: it has no next prompt")
        if self._pending is None:
            self._pending = self._conversation.prompt()
        return list(self._pending)

    def advance(self, response_token_ids: Sequence[int], logprobs: Sequence[float], weight_version: int, *,
                temperature: float = 1.0, top_p: float = 1.0) -> StepOutcome:
        """Apply the sampled response (drawn at ``temperature`` and ``top_p``): step the environment, record the
        turn, extend the conversation."""
        prompt = self.prompt()
        response = list(response_token_ids)
        outcome = self._env.step(self._codec.decode(_without_eos(response, self._codec.eos_id)))
        self.trajectory.add_turn(
            Turn(
                prompt_token_ids=tuple(prompt),
                response_token_ids=tuple(response),
                behaviour_logprobs=tuple(float(x) for x in logprobs),
                weight_version=weight_version,
                reward=outcome.reward,
                temperature=temperature,
                top_p=top_p,
            )
        )
        self._pending = None
        if outcome.done:
            self.trajectory.finish(success=self._env.success)
        else:
            self._conversation.add_response(response)
            self._conversation.add_observation(self._codec.encode(outcome.observation))
        return outcome


def _without_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids
