"""The controller's one loop: one place pumps, hooks never wait, and a message that arrives while the job
starts a weight sync is handled by the loop after that call returned, never inside it."""

from __future__ import annotations

import ast
import inspect
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from rose_core.app.config import RunConfig
from rose_core.app.controller.control_loop import ControlLoop, NestedWait
from rose_core.app.controller.controller import Controller
from rose_core.app.controller.job_hooks import AcceptedTurn, NoJob, TurnPayload
from rose_core.protocol import messages as m
from rose_core.scheduler import TurnTicket
from rose_core.testing.inprocess_channel import InProcessClient, InProcessServer

SECRET = b"k" * 32
CORE_SRC = Path(__file__).parents[2] / "packages" / "rose-core" / "src" / "rose_core"


@pytest.fixture
def controller() -> Iterator[Controller]:
    ctl = Controller(RunConfig(), SECRET, server=InProcessServer(SECRET))
    yield ctl
    ctl.close()


def pump_calls(path: Path) -> list[int]:
    """Lines of ``path`` that call a ``pump`` method."""
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "pump"]


def test_the_loop_is_the_only_caller_of_pump() -> None:
    calls = {str(p.relative_to(CORE_SRC)): lines for p in CORE_SRC.rglob("*.py") if (lines := pump_calls(p))}
    assert list(calls) == ["app/controller/control_loop.py"] and len(calls["app/controller/control_loop.py"]) == 1


class StackRecorder(NoJob):
    """Records, for each accepted result, the functions on the stack when the loop handed it over."""

    def __init__(self) -> None:
        self.stacks: list[list[str]] = []

    def on_result(self, accepted: AcceptedTurn) -> None:
        self.stacks.append([frame.function for frame in inspect.stack()])


def test_a_result_arriving_during_a_weight_sync_is_handled_after_the_sync_call_not_inside_it(
        controller: Controller) -> None:
    """The executor answers its running turn as the announce reaches it (inside the controller's send, as a
    fast executor's result can land while the sync is being started): the job sees the result only once the
    loop runs, with ``announce_weights`` long returned."""
    job = StackRecorder()
    controller.attach(job)
    requests: list[m.TurnRequest] = []

    def executor(_peer: bytes, msg: object) -> None:
        if isinstance(msg, m.TurnRequest):
            requests.append(msg)
        elif isinstance(msg, m.WeightAnnounce):
            (req,) = requests
            client.send(m.TurnResult(
                turn_id=req.turn_id, trajectory_id=req.trajectory_id, attempt=req.attempt, executor_id="d1",
                weight_version=0, output_token_ids=np.array([1], dtype=np.int32),
                output_logprobs=np.array([-0.1], dtype=np.float32), finish_reason="stop"))
            client.send(m.WeightApplied(executor_id="d1", version=msg.version, seconds=0.0, bytes_received=1))

    client = InProcessClient(controller.address, SECRET, "d1", on_message=executor)
    loop = ControlLoop(controller)
    client.send(m.Hello(peer_id="d1", kind="executor"))
    client.send(m.Register(executor_id="d1", role="dedicated", device="cpu", host="h", models=[], memory_bytes=1,
                           rollout_capacity=4, weight_version=0))
    payload = TurnPayload(np.arange(3, dtype=np.int32), m.SamplingParams(max_tokens=1), step=1)
    controller.submit_turn(TurnTicket("t1", "x1", 0, 1, 0.0, payload=payload))
    loop.turn(0)
    assert len(requests) == 1 and not job.stacks
    weight_round = controller.announce_weights(m.WeightAnnounce(version=1, step=1, source="tcp://x:1"))
    assert not job.stacks and not weight_round.future.done()  # arrived, not handled yet
    applied = loop.result(weight_round.future, 5.0, weight_round.timed_out)
    assert applied["d1"].ok and len(job.stacks) == 1
    assert "announce_weights" not in job.stacks[0] and "turn" in job.stacks[0]
    client.close()


def test_a_hook_that_waits_is_refused(controller: Controller) -> None:
    loop = ControlLoop(controller)

    class Impatient(NoJob):
        def on_tick(self, now: float) -> None:
            loop.wait(Future(), 0.0)

    controller.attach(Impatient())
    with pytest.raises(NestedWait, match="inside the controller's loop"):
        loop.turn(0)


def test_a_watchdog_that_raises_ends_the_wait(controller: Controller) -> None:
    def gone() -> None:
        raise RuntimeError("executor d1 is gone")

    loop = ControlLoop(controller, [gone])
    with pytest.raises(RuntimeError, match="d1 is gone"):
        loop.wait(Future())
    loop.watchdogs = []
    assert loop.wait(Future(), time.monotonic() + 0.01) is False  # usable again: the failed wait left no flag set
