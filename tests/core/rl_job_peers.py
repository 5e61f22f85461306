"""The peers of an RL job in tests: a test executor that plays FrozenLake moves and applies weight versions (over
the in-process channel or real ZMQ sockets), a recording trainer, a publisher that publishes nothing, and a
one-token-per-character codec."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rose_core.app.controller.controller import Controller
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.protocol import messages as m
from rose_core.protocol.engine_layout import EngineLayout
from rose_core.testing.inprocess_channel import InProcessClient

SECRET = b"k" * 32


class CharCodec:
    """One token per character (ids 3..), EOS 2: enough for the episode's text round trip."""

    bos_id = None
    eos_id = 2

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 3 for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - 3) for i in ids if i >= 3)


@dataclass
class Executor:
    """A test peer: answers every turn with a move (``policy(turn request) -> move``) on its weight version,
    and applies every announced version."""

    ctl: Controller
    policy: Any
    version: int = 0
    requests: list[m.TurnRequest] = field(default_factory=list)
    client: Any = None
    eid: str = "d0"
    spoil: Callable[[m.TurnResult], m.TurnResult] = lambda result: result
    """What it does to each result before sending it (a broken executor: NaN logprobs, wrong lengths)."""

    def join(self, eid: str = "d0", client_type: Any = InProcessClient) -> Executor:
        self.eid = eid
        self.client = client_type(self.ctl.address, SECRET, eid, on_message=self.on_message)
        self.client.send(m.Hello(peer_id=eid, kind="executor"))
        self.ctl.pump(0.2)
        self.client.send(m.Register(executor_id=eid, role="dedicated", device="cpu", host="h", models=[],
                                    memory_bytes=1, rollout_capacity=64, weight_version=0))
        self.ctl.pump(0.2)
        return self

    def on_message(self, _peer: bytes, msg: object) -> None:
        assert self.client is not None
        if isinstance(msg, m.TurnRequest):
            self.requests.append(msg)
            tokens = [*CharCodec().encode(self.policy(msg)), CharCodec.eos_id]
            self.client.send(self.spoil(m.TurnResult(
                turn_id=msg.turn_id, trajectory_id=msg.trajectory_id, attempt=msg.attempt, executor_id=self.eid,
                weight_version=self.version, output_token_ids=np.array(tokens, dtype=np.int32),
                output_logprobs=np.full(len(tokens), -0.5, dtype=np.float32), finish_reason="stop")))
        elif isinstance(msg, m.WeightAnnounce):
            self.version = msg.version
            self.client.send(m.WeightApplied(executor_id=self.eid, version=msg.version, seconds=0.0,
                                             bytes_received=1))


@dataclass
class Trainer:
    """Records what it trained on and on which thread; its checkpoints are JSON files."""

    executor: Executor
    calls: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    wait_s: float = 0.0
    last_step: int = 0
    """How long a step waits for a turn of the next step to reach the executor (synchronous steps: it
    cannot, the next step starts after this one returns; asynchronous: it does, as soon as the job pumps)."""

    def train_step(self, samples: list[TrainSample]) -> Any:
        self.steps += 1
        step = max(int(s.trajectory_id.split("-")[0][1:]) for s in samples)
        self.calls.append({"samples": samples, "thread": threading.current_thread().name,
                           "next_step_ran": self._next_step_runs(step + 1)})
        return None

    def _next_step_runs(self, step: int) -> bool:
        """Whether a turn of ``step`` reaches the executor while this step trains (given ``wait_s``)."""
        deadline = time.monotonic() + (self.wait_s if step <= self.last_step else 0.0)
        while True:
            if any(r.step == step for r in self.executor.requests):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def export_weights(self) -> dict[str, Any]:
        return {"w": self.steps}

    def engine_layout(self) -> EngineLayout:
        return EngineLayout(engine="vllm")

    def save_checkpoint(self, root: Path, *, step: int, weight_version: int, keep: int, extra: Mapping[str, Any],
                        rl: Mapping[str, Any]) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"step-{step:06d}"
        path.write_text(f"{step} {weight_version} {self.steps}")
        return path

    def load_checkpoint(self, path: Path) -> Any:
        step, version, steps = (int(x) for x in path.read_text().split())
        self.steps = steps
        return type("State", (), {"step": step, "weight_version": version})()


class Publisher:
    def publish(self, version: int, step: int, tensors: Mapping[str, Any], *,
                layout: EngineLayout | None = None) -> m.WeightAnnounce:
        return m.WeightAnnounce(version=version, step=step, source="test")

    def start_relay(self, relay_id: str, *, transport: str = "tcp") -> Any:
        raise NotImplementedError("no relays in this test")

    def close(self) -> None:
        return None
