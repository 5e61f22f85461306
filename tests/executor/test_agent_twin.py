"""The executor agent's message handling on this event loop, over the in-process twins: the control channel is
rose-core's ``InProcessServer`` / ``InProcessClient`` (real framing and auth, no sockets) and the engines are
``FakeEngine``s on the wall clock (the agent's own loops run in real time). What is about vLLM, ZMQ and the
process (endpoint, weight reload, signals, orphans, exit codes) stays in ``test_agent``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
import torch
from prometheus_client import REGISTRY

from rose_core.config.executor_config import load_executor_config
from rose_core.policy import LatencyModel
from rose_core.protocol import messages as m
from rose_core.protocol.auth import Signer, executor_credential, weights_key
from rose_core.protocol.messages import (
    CancelTurn,
    ErrorReport,
    Goodbye,
    Heartbeat,
    Hello,
    Register,
    SamplingParams,
    Shutdown,
    StepStarted,
    TurnAborted,
    TurnResult,
    WeightAnnounce,
    WeightApplied,
    Welcome,
)
from rose_core.protocol.wire import Framer
from rose_core.support.errors import RoseError
from rose_core.support.metrics import free_port
from rose_core.testing.inprocess_channel import InProcessClient, InProcessServer
from rose_executor.agent import AgentOptions, ExecutorAgent
from rose_executor.engine.engine_protocol import GenerationOutput, WeightCommit
from rose_executor.engine.engine_spec import EngineSpec
from rose_executor.host.device import Device, resolve_device
from rose_executor.memory.serving_first_budget import rollout_engine_bytes, serving_host_bytes
from rose_executor.testing.fake_engine import FakeEngine, FakeEngineLauncher
from rose_transfer import SparsePublisher

from .conftest import SECRET
from .controller_peer import ControllerPeer
from .executor_setup import H200_BYTES, LONG, memory_settings, nvml_gpus, turn, write_config

MODELS = {
    "serving": LatencyModel(0.002, 10e-6, 0.001, 0.0001),
    "rollout": LatencyModel(0.002, 10e-6, 0.001, 0.0001),
}
_requests = count()


@dataclass
class TwinExecutor:
    agent: ExecutorAgent
    task: asyncio.Task[int]
    controller: ControllerPeer
    register: Register
    launcher: FakeEngineLauncher

    @property
    def serving(self) -> FakeEngine:
        return self.launcher.engines[0]

    async def serve(self, prompt: list[int], max_tokens: int) -> GenerationOutput:
        """One production request on the serving engine (what the OpenAI endpoint would submit)."""
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        return await self.serving.generate(f"serve-{next(_requests)}", prompt, params)


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("twin-profiles")  # the twins' profiles, measured once per module


def start_agent(
    path: Path, executor_id: str, launcher: FakeEngineLauncher | None = None, parent_pid: int | None = None
) -> tuple[InProcessServer, ControllerPeer, ExecutorAgent, asyncio.Task[int]]:
    """A serving agent on the twins, running, with its own in-process controller (not welcomed yet)."""
    server = InProcessServer(SECRET)
    controller = ControllerPeer(SECRET, server)
    options = AgentOptions(controller=server.address, role="serving", executor_id=executor_id,
                           credential=executor_credential(SECRET, executor_id), parent_pid=parent_pid,
                           freeze_heap=False)  # pytest's heap, not an executor's
    agent = ExecutorAgent(load_executor_config(path), options, launcher or FakeEngineLauncher(MODELS),
                          connect=InProcessClient)
    return server, controller, agent, asyncio.create_task(agent.run())


@contextlib.asynccontextmanager
async def twin(path: Path, launcher: FakeEngineLauncher | None = None) -> AsyncIterator[TwinExecutor]:
    """An agent with id ``ex-1`` on the twins, welcomed and registered; stopped on the way out."""
    launcher = launcher or FakeEngineLauncher(MODELS)
    server, controller, agent, task = start_agent(path, "ex-1", launcher)
    try:
        hello = await controller.arrival(Hello, timeout=10)
        assert (hello.peer_id, hello.kind) == ("ex-1", "executor")
        controller.send(Welcome(controller_id="test-controller", heartbeat_interval_s=0.3, stall_timeout_s=5.0))
        register = await controller.arrival(Register, timeout=60)
        yield TwinExecutor(agent, task, controller, register, launcher)
    finally:
        agent.request_stop("test over")
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)
        server.close()


@pytest.fixture
def config_path(tmp_path: Path, policy_dir: Path, serving_dir: Path, profiles: Path) -> Path:
    memory = memory_settings(policy_dir, serving_dir)
    return write_config(tmp_path / "executor.toml", policy_dir, serving_dir, free_port(), profiles, **memory)


@pytest_asyncio.fixture
async def executor(config_path: Path) -> AsyncIterator[TwinExecutor]:
    async with twin(config_path) as executor:
        yield executor


async def test_register_describes_the_host(executor: TwinExecutor) -> None:
    reg = executor.register
    assert (reg.executor_id, reg.role, reg.device, reg.weight_version) == ("ex-1", "serving", "cpu", 0)
    assert reg.rollout_capacity == 2
    assert [(m.purpose, m.name) for m in reg.models] == [("serving", "prod"), ("rollout", "policy")]
    assert reg.models[1].parameters > 0 and reg.models[1].kv_bytes_per_token == 512
    assert reg.serving_endpoint.startswith("http://127.0.0.1:") and reg.serving_endpoint.endswith("/v1")
    assert reg.memory_bytes > 1 << 30
    assert [e.spec.purpose for e in executor.launcher.engines] == ["serving", "rollout"]


async def test_on_a_gpu_host_the_engines_split_the_device_and_register_names_it(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML sees one H200 (torch's CUDA seams monkeypatched): ``device = "auto"`` resolves to it without the CUDA
    runtime, which the executor first touches once production's engine exists (a runtime initialised before
    vLLM forks its engine cores leaves them without CUDA); each engine gets its memory fraction, only the
    rollout engine sleep mode, and Register names the GPU and its memory."""
    launcher = FakeEngineLauncher(MODELS)
    nvml_gpus(monkeypatch, 1, runtime_allowed=lambda: bool(launcher.engines))
    async with twin(config_path, launcher) as executor:
        reg = executor.register
        assert (reg.device, reg.memory_bytes) == ("cuda:0 (NVIDIA H200)", H200_BYTES)
        serving, rollout = (engine.spec for engine in executor.launcher.engines)
        assert (serving.device, serving.gpu_memory_utilization, serving.enable_sleep_mode) == ("cuda", 0.55, False)
        assert (rollout.device, rollout.gpu_memory_utilization, rollout.enable_sleep_mode) == ("cuda", 0.3, True)
        assert not serving.enforce_eager and executor.launcher.engines[1].can_release_memory


def test_the_seam_catches_the_old_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``resolve_device("auto")`` used to call, ``torch.cuda.is_available()`` without
    ``PYTORCH_NVML_BASED_CUDA_CHECK``, initialises the CUDA runtime: the seam above fails it."""
    nvml_gpus(monkeypatch, 1, runtime_allowed=lambda: False)
    with pytest.raises(AssertionError, match="CUDA runtime was initialised"):
        torch.cuda.is_available()
    assert resolve_device("auto").on_gpu and os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"


async def test_heartbeats_carry_the_load(executor: TwinExecutor) -> None:
    peer = executor.controller
    first = await peer.arrival(Heartbeat, timeout=5)
    second = await peer.arrival(Heartbeat, timeout=5)
    assert second.seq > first.seq and second.executor_id == "ex-1"
    load = second.load
    assert (load.weight_version, load.rollout_capacity, load.slo_headroom, load.state) == (0, 2, True, "ready")


async def test_rollout_waits_for_serving_headroom(executor: TwinExecutor) -> None:
    peer = executor.controller
    await executor.serve([9, 8, 7], 4)
    peer.send(turn("held"))
    beat = await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.state == "held")
    assert not beat.load.slo_headroom and beat.load.rollout_in_flight == 1
    result = await peer.arrival(TurnResult, where=lambda r: r.turn_id == "held")
    assert result.queue_seconds > 0.5  # held until the violating samples left the 2 s window
    await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.slo_headroom and h.load.state == "ready")


async def test_turn_result_carries_the_version(executor: TwinExecutor) -> None:
    peer = executor.controller
    peer.send(turn("t1"))
    result = await peer.arrival(TurnResult, where=lambda r: r.turn_id == "t1")
    assert (result.executor_id, result.weight_version, result.attempt) == ("ex-1", 0, 0)
    assert result.output_token_ids.dtype == np.int32 and result.output_logprobs.dtype == np.float32
    assert 1 <= len(result.output_token_ids) == len(result.output_logprobs) <= 10
    assert result.finish_reason in ("length", "stop") and result.run_seconds > 0
    beat = await peer.arrival(Heartbeat, timeout=5)
    assert "traj-t1" in beat.load.warm_trajectories
    assert beat.load.rollout_tokens_total >= len(result.output_token_ids)


async def test_wrong_version_and_capacity_are_refused(executor: TwinExecutor) -> None:
    peer = executor.controller
    peer.send(turn("t-v5", version=5))
    aborted = await peer.arrival(TurnAborted, where=lambda a: a.turn_id == "t-v5")
    assert aborted.reason == "version"
    long = SamplingParams(max_tokens=200, temperature=0.0)
    for name in ("c1", "c2", "c3"):
        peer.send(turn(name, sampling=long))
    refused = await peer.arrival(TurnAborted, where=lambda a: a.turn_id == "c3")
    assert refused.reason == "capacity"
    for name in ("c1", "c2"):
        await peer.arrival(TurnResult, where=lambda r, name=name: r.turn_id == name)


async def test_cancel_turn_gets_no_reply(executor: TwinExecutor) -> None:
    peer = executor.controller
    peer.send(turn("x1", sampling=SamplingParams(max_tokens=900, temperature=0.0)))
    await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 1)
    peer.send(CancelTurn(turn_id="x1", attempt=0))
    await peer.quiet(1.5, where=lambda m: getattr(m, "turn_id", "") == "x1")
    await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 0)


async def test_memory_cut_aborts_and_freezes_until_the_next_step(executor: TwinExecutor) -> None:
    """Serving traffic crosses the high watermark: one 2x cut, the youngest rollout turn that no longer fits
    is given back as ``memory``, the budget stays frozen (new long turns refused) until StepStarted."""
    peer = executor.controller
    for name in ("m1", "m2"):
        peer.send(turn(name, sampling=LONG))
    await peer.arrival(
        Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 2 and not h.load.rollout_budget_frozen
    )
    await executor.serve([4, 5, 6], 300)
    aborted = await peer.arrival(TurnAborted, timeout=10, where=lambda a: a.turn_id in ("m1", "m2"))
    assert aborted.reason == "memory"
    survivor = "m2" if aborted.turn_id == "m1" else "m1"
    assert (await peer.arrival(Heartbeat, timeout=5)).load.rollout_budget_frozen
    peer.send(turn("m3", sampling=LONG))  # one long turn already holds the whole cut budget
    assert (await peer.arrival(TurnAborted, where=lambda a: a.turn_id == "m3")).reason == "memory"
    await peer.arrival(TurnResult, where=lambda r: r.turn_id == survivor)
    peer.send(StepStarted(step=1, weight_version=0))
    await peer.arrival(Heartbeat, timeout=5, where=lambda h: not h.load.rollout_budget_frozen)
    peer.send(turn("m4", sampling=LONG))
    await peer.arrival(TurnResult, where=lambda r: r.turn_id == "m4")


def lease_gauges() -> tuple[float, float, float]:
    """The host's lease metrics: lent (1 or 0), the rollout engine's bytes, serving's budget in bytes."""
    names = ("rose_executor_lease_active", "rose_executor_rollout_engine_bytes", "rose_executor_serving_budget_bytes")
    return tuple(REGISTRY.get_sample_value(name) or 0.0 for name in names)  # type: ignore[return-value]


async def test_sigusr1_revokes_the_host_its_turns_come_back_the_lease_ends_and_serving_goes_on(
    executor: TwinExecutor, config_path: Path
) -> None:
    """The serving owner's signal: a heartbeat saying ``revoked`` comes first (the controller re-routes on it),
    then the turn in flight comes back as ``revoked`` and the lease ends (Goodbye, the rollout engine stopped,
    its memory back to serving); serving answers throughout and the host looks for its next job."""
    peer, (serving, rollout) = executor.controller, executor.launcher.engines
    whole = serving_host_bytes(load_executor_config(config_path), Device("cpu"))
    lent = lease_gauges()
    assert lent[0] == 1 and lent[1] > 0 and lent[2] == max(0, whole - lent[1])
    peer.send(turn("r1", sampling=LONG))
    await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 1)
    os.kill(os.getpid(), signal.SIGUSR1)
    beat = await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.revoked)
    assert beat.load.state == "revoked"
    given_back = await peer.arrival(TurnAborted, timeout=5, where=lambda a: a.turn_id == "r1")
    assert given_back.reason == "revoked"
    goodbye = await peer.arrival(Goodbye, timeout=10)
    assert goodbye.reason == "revoked: the serving owner sent SIGUSR1 (rose-executor revoke)"
    assert len((await executor.serve([3, 4, 5], 4)).token_ids) == 4
    await peer.arrival(Hello, timeout=10)  # whether this job takes it again is the job's call: it does not
    assert rollout.shut_down and not serving.shut_down
    assert lease_gauges() == (0, 0, whole)  # no lease, no rollout engine memory, serving's whole share
    assert (executor.agent.lent_to, executor.agent.leases) == ("", 1) and not executor.task.done()


async def test_a_serving_host_lent_to_one_job_refuses_a_second_and_names_the_holder(
    executor: TwinExecutor, config_path: Path
) -> None:
    """A second executor for the same serving endpoint stops at start with the holder's name (one process lends
    an endpoint, to one job at a time), before it touches an engine; the first one keeps serving its job."""
    server, second_job, _agent, task = start_agent(config_path, "ex-2")
    try:
        with pytest.raises(RoseError, match=r"held by rose-executor ex-1 .* which lends it to the RL jobs at"):
            await asyncio.wait_for(task, 30)
        await second_job.quiet(0.2, lambda msg: isinstance(msg, Hello))
    finally:
        server.close()
    assert (await executor.controller.arrival(Heartbeat, timeout=5)).load.state == "ready"


async def test_failed_fetch_keeps_the_version(executor: TwinExecutor) -> None:
    peer = executor.controller
    peer.send(WeightAnnounce(version=2, step=2, source=f"tcp://127.0.0.1:{free_port()}"))
    failed = await peer.arrival(WeightApplied, timeout=60, where=lambda w: w.version == 2)
    assert not failed.ok and "cannot fetch weight version 2" in failed.error
    peer.send(StepStarted(step=2, weight_version=0))
    beat = await peer.arrival(Heartbeat, timeout=5)
    assert beat.load.weight_version == 0 and beat.load.state == "ready"


async def test_an_update_that_finds_the_rollout_engine_dead_says_so(executor: TwinExecutor) -> None:
    """The rollout engine's process died during an update: the failure names it (the job and the operator read
    "the rollout engine died", not only vLLM's own words)."""
    peer, rollout = executor.controller, executor.launcher.engines[1]

    async def dead(order: object) -> None:
        rollout.errored = True
        raise RuntimeError("EngineCore encountered an issue. See stack trace (above) for the root cause.")

    rollout.stage_weights = dead  # type: ignore[assignment]
    peer.send(WeightAnnounce(version=2, step=2, source="tcp://127.0.0.1:1"))
    failed = await peer.arrival(WeightApplied, timeout=10, where=lambda w: w.version == 2)
    assert not failed.ok and failed.error.startswith("the rollout engine died: EngineCore encountered an issue")


async def test_an_update_whose_prefix_cache_stays_fails_and_the_engine_takes_no_more_turns(
    executor: TwinExecutor,
) -> None:
    """vLLM answers False to a prefix-cache reset while KV blocks are in use: the version is in the engine, but
    KV of the old weights could serve its next turns. The update fails (the job takes the executor out) and the
    engine refuses every turn from then on."""
    peer, rollout = executor.controller, executor.launcher.engines[1]
    rollout.prefix_reset_ok = False
    with SparsePublisher(secret=weights_key(SECRET), host="127.0.0.1", port=0) as publisher:
        peer.send(publisher.publish(1, 1, {"w": np.arange(5000, dtype=np.float32)}))
        failed = await peer.arrival(WeightApplied, timeout=30, where=lambda w: w.version == 1)
    assert not failed.ok and "could not drop its prefix cache" in failed.error
    assert rollout.calls[-2:] == ["commit_weights(v1)", "reset_prefix_cache"]
    for name, version in (("new", 1), ("old", 0)):
        peer.send(turn(name, version=version))
        await peer.arrival(TurnAborted, where=lambda a, n=name: a.turn_id == n)  # refused, never run
    await peer.quiet(1.0, where=lambda msg: isinstance(msg, TurnResult))


async def test_a_digest_the_engine_does_not_vouch_for_fails_the_update_and_the_engine_takes_no_more_turns(
    executor: TwinExecutor,
) -> None:
    """The engine's own account of what it holds after the commit (vLLM: the workers' digest, after each copy
    was checked where it lives) differs from what the trainer published: the update fails, no turn runs."""
    peer, rollout = executor.controller, executor.launcher.engines[1]
    real = rollout.commit_weights

    async def off_by_a_bit(version: int, timeout_s: float) -> WeightCommit:
        return dataclasses.replace(await real(version, timeout_s), digest="0" * 16)

    rollout.commit_weights = off_by_a_bit  # type: ignore[method-assign]
    with SparsePublisher(secret=weights_key(SECRET), host="127.0.0.1", port=0) as publisher:
        peer.send(publisher.publish(1, 1, {"w": np.arange(5000, dtype=np.float32)}))
        failed = await peer.arrival(WeightApplied, timeout=30, where=lambda w: w.version == 1)
    assert not failed.ok and "the engine holds digest 0000000000000000" in failed.error
    peer.send(turn("after", version=1))
    await peer.arrival(TurnAborted, where=lambda a: a.turn_id == "after")
    await peer.quiet(1.0, where=lambda msg: isinstance(msg, TurnResult))


async def test_an_update_during_a_release_waits_for_it_and_never_writes_into_released_memory(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the guard puts an idle policy's engine to sleep (level 1 unmaps its memory), and the twin's
    engine raises on a stage or commit while released. A version announced while a slow release is under way
    waits for it, wakes the engine, and applies."""
    launcher = FakeEngineLauncher(MODELS)
    nvml_gpus(monkeypatch, 1)
    async with twin(config_path, launcher) as executor:
        peer, rollout = executor.controller, launcher.engines[1]
        await until(lambda: rollout.memory_released)  # idle: released
        rollout.release_delay_s = 0.5
        peer.send(turn("t1"))
        await peer.arrival(TurnResult, where=lambda r: r.turn_id == "t1")
        await until(lambda: rollout.calls.count("release_memory") >= 2)  # idle again: a slow release begins
        with SparsePublisher(secret=weights_key(SECRET), host="127.0.0.1", port=0) as publisher:
            peer.send(publisher.publish(1, 1, {"w": np.arange(5000, dtype=np.float32)}))
            applied = await peer.arrival(WeightApplied, timeout=30, where=lambda w: w.version == 1)
    assert applied.ok, applied.error
    after = rollout.calls[len(rollout.calls) - rollout.calls[::-1].index("release_memory"):]
    assert after[:4] == ["restore_memory", "stage_weights(v1)", "commit_weights(v1)", "reset_prefix_cache"]


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the timeout"
        await asyncio.sleep(0.01)


async def test_shutdown_says_goodbye_and_gives_turns_back(executor: TwinExecutor) -> None:
    peer = executor.controller
    peer.send(turn("last", sampling=SamplingParams(max_tokens=900, temperature=0.0)))
    await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 1)
    peer.send(Shutdown(reason="test over"))
    given_back = await peer.arrival(TurnAborted, where=lambda a: a.turn_id == "last")
    assert given_back.reason == "shutdown"
    goodbye = await peer.arrival(Goodbye, timeout=10)
    assert goodbye.peer_id == "ex-1" and "test over" in goodbye.reason
    assert await asyncio.wait_for(executor.task, 30) == 0
    assert all(e.num_unfinished_requests() == 0 for e in executor.launcher.engines)


async def test_a_restarted_controller_gets_the_executor_back_and_its_old_turns_are_given_back(
    executor: TwinExecutor,
) -> None:
    """What a controller that restarted answers (signed ``no_handshake``): Hello again, Register on the Welcome,
    the old controller's turns given back; the engines and serving never stop."""
    peer = executor.controller
    peer.send(turn("old", sampling=SamplingParams(max_tokens=900, temperature=0.0)))
    await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 1)
    peer.send(ErrorReport(code="no_handshake", message="send Hello before anything else"))
    hello = await peer.arrival(Hello, timeout=5)
    assert (hello.peer_id, hello.kind) == ("ex-1", "executor")
    aborted = await peer.arrival(TurnAborted, timeout=5, where=lambda a: a.turn_id == "old")
    assert aborted.reason == "controller_restarted"
    peer.send(ErrorReport(code="no_handshake", message="a second one while joining"))  # one Hello per attempt
    await peer.quiet(0.5, lambda m: isinstance(m, Hello))
    peer.send(Welcome(controller_id="restarted", heartbeat_interval_s=0.3, stall_timeout_s=5.0))
    register = await peer.arrival(Register, timeout=5)
    assert (register.executor_id, register.role, register.weight_version) == ("ex-1", "serving", 0)
    assert executor.agent.rejoins == 1 and not executor.task.done()
    assert (await executor.serve([1, 2, 3], 4)).token_ids  # production serving went on throughout
    peer.send(turn("new"))
    result = await peer.arrival(TurnResult, timeout=10, where=lambda r: r.turn_id == "new")
    assert result.output_token_ids.size > 0


async def test_a_forged_unsigned_notice_changes_nothing(executor: TwinExecutor) -> None:
    """Anyone can send an unsigned notice (it is how a peer with the wrong secret is told why): shown, not acted on."""
    peer = executor.controller
    peer.send(turn("kept", sampling=SamplingParams(max_tokens=900, temperature=0.0)))
    await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 1)
    forged = Framer(Signer(b"x" * 32), m.FromController).notice("no_handshake", "send Hello before anything else")
    peer.server.send_frames(peer.peer, forged)  # type: ignore[attr-defined]
    await peer.quiet(0.5, lambda msg: isinstance(msg, Hello | TurnAborted))
    result = await peer.arrival(TurnResult, timeout=30, where=lambda r: r.turn_id == "kept")
    assert result.output_token_ids.size > 0 and executor.agent.rejoins == 0


async def test_a_dead_rollout_engine_ends_the_lease_and_serving_goes_on(executor: TwinExecutor) -> None:
    """The rollout engine is the job's: when it dies the host gives the lease back (Goodbye), stops it, goes on
    serving, and lends itself again."""
    peer, rollout = executor.controller, executor.launcher.engines[1]
    rollout.errored = True
    goodbye = await peer.arrival(Goodbye, timeout=10)
    assert "rollout engine died" in goodbye.reason
    assert (await executor.serve([3, 4, 5], 4)).token_ids and not executor.task.done()
    hello = await peer.arrival(Hello, timeout=10)  # lent to the next job that takes it (this controller again)
    assert hello.peer_id == "ex-1" and rollout.shut_down
    peer.send(Welcome(controller_id="next-job", heartbeat_interval_s=0.3, stall_timeout_s=5.0))
    register = await peer.arrival(Register, timeout=30)
    assert register.weight_version == 0 and len(executor.launcher.engines) == 3  # a fresh rollout engine
    assert executor.agent.lent_to == "next-job" and executor.agent.leases == 1


async def test_a_failure_in_the_leases_work_ends_the_lease_not_production(executor: TwinExecutor) -> None:
    """A call into the job's rollout engine that raises (vLLM's engine core died under it) fails the guard's
    loop: the lease ends, its turn comes back, production serves on and the host lends itself again."""
    peer, rollout = executor.controller, executor.launcher.engines[1]

    async def dead(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("EngineDeadError: the engine core died")

    rollout.resume = dead  # type: ignore[method-assign]
    peer.send(turn("t1"))
    assert (await peer.arrival(TurnAborted, timeout=10, where=lambda a: a.turn_id == "t1")).reason == "released"
    goodbye = await peer.arrival(Goodbye, timeout=10)
    assert "the lease's work failed" in goodbye.reason and "EngineDeadError" in goodbye.reason
    assert (await executor.serve([3, 4, 5], 4)).token_ids
    await peer.arrival(Hello, timeout=10)
    assert not executor.task.done() and rollout.shut_down


async def test_a_dead_serving_engine_stops_the_executor_with_exit_1(executor: TwinExecutor) -> None:
    executor.serving.errored = True
    goodbye = await executor.controller.arrival(Goodbye, timeout=10)
    assert "serving engine died" in goodbye.reason
    assert await asyncio.wait_for(executor.task, 30) == 1


async def test_a_released_serving_host_gives_its_turns_back_stops_the_rollout_engine_and_serves_on(
    executor: TwinExecutor, tmp_path: Path, policy_dir: Path
) -> None:
    """The job is done with the host (it ended, or took it out): turns back, Goodbye, the rollout engine stopped,
    production untouched; the next job's controller gets the host with the policy it names."""
    peer = executor.controller
    peer.send(turn("long", sampling=LONG))
    await peer.arrival(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 1)
    peer.send(m.Release(reason="run finished"))
    given_back = await peer.arrival(TurnAborted, timeout=10, where=lambda a: a.turn_id == "long")
    assert given_back.reason == "released"
    goodbye = await peer.arrival(Goodbye, timeout=10)
    assert "released" in goodbye.reason and "run finished" in goodbye.reason
    assert (await executor.serve([3, 4, 5], 4)).token_ids and not executor.task.done()
    other_policy = tmp_path / "policy-b"
    shutil.copytree(policy_dir, other_policy)
    await peer.arrival(Hello, timeout=10)  # the lease is over: it looks for the next job
    serving, rollout = executor.launcher.engines
    assert rollout.shut_down and not serving.shut_down
    assert (executor.agent.lent_to, executor.agent.leases) == ("", 1)
    peer.send(Welcome(controller_id="job-b", heartbeat_interval_s=0.3, stall_timeout_s=5.0,
                      policy_model_dir=str(other_policy)))
    register = await peer.arrival(Register, timeout=30)
    assert [model.path for model in register.models if model.purpose == "rollout"] == [str(other_policy)]
    assert executor.launcher.engines[2].spec.model_dir == other_policy
    peer.send(turn("b1"))
    assert (await peer.arrival(TurnResult, timeout=10, where=lambda r: r.turn_id == "b1")).output_token_ids.size
    peer.send(Shutdown(reason="operator"))  # only its operator stops it
    assert await asyncio.wait_for(executor.task, 30) == 0


class StuckCommit(FakeEngineLauncher):
    """Engines whose second commit never returns (the process is killed in the middle of it)."""

    async def start(self, spec: EngineSpec) -> FakeEngine:
        engine = await super().start(spec)
        real = engine.commit_weights

        async def commit(version: int, timeout_s: float) -> WeightCommit:
            if version >= 2:
                await asyncio.Event().wait()
            return await real(version, timeout_s)

        engine.commit_weights = commit  # type: ignore[method-assign]
        return engine


async def test_an_executor_killed_mid_apply_comes_back_with_a_full_sync(config_path: Path) -> None:
    with SparsePublisher(secret=weights_key(SECRET), host="127.0.0.1", port=0) as publisher:
        versions = {v: {"w": np.arange(5000, dtype=np.float32) + v} for v in (1, 2)}
        async with twin(config_path, StuckCommit(MODELS)) as first:
            first.controller.send(publisher.publish(1, 1, versions[1]))
            assert (await first.controller.arrival(WeightApplied, timeout=30)).ok
            announce = publisher.publish(2, 2, versions[2])
            first.controller.send(announce)
            await first.controller.arrival(Heartbeat, timeout=10, where=lambda h: h.load.state == "updating")
            first.task.cancel()  # killed while version 2 is being applied
            await asyncio.gather(first.task, return_exceptions=True)
        async with twin(config_path) as again:
            assert again.register.weight_version == 0  # a new process holds what it loaded, nothing staged
            again.controller.send(announce)
            applied = await again.controller.arrival(WeightApplied, timeout=30, where=lambda w: w.version == 2)
    assert applied.ok and applied.full_sync and applied.weights_digest == announce.manifest_digest
    np.testing.assert_array_equal(again.launcher.engines[1].weights.arrays()["w"], versions[2]["w"])


async def test_an_executor_whose_launcher_is_gone_stops_itself(config_path: Path) -> None:
    """`rose run` passes --parent-pid: a launcher killed with SIGKILL must not leave its executors running, lent
    to a job or not (here: before any job welcomed it)."""
    # parent_pid: not this process's parent, so the launcher is gone
    server, controller, agent, task = start_agent(config_path, "ex-3", parent_pid=os.getppid() + 1)
    try:
        assert await asyncio.wait_for(task, 60) == 1
        assert agent.leases == 0
        await controller.quiet(0.2, lambda msg: isinstance(msg, Hello))
    finally:
        server.close()


class FirstRolloutFails(FakeEngineLauncher):
    """The first rollout engine does not start (a job's policy this host cannot load, memory taken)."""

    failed = False

    async def start(self, spec: EngineSpec) -> FakeEngine:
        if spec.purpose == "rollout" and not self.failed:
            self.failed = True
            raise RoseError("the rollout engine ran out of memory")
        return await super().start(spec)


async def test_a_job_whose_rollout_engine_does_not_start_costs_production_nothing(
    tmp_path: Path, policy_dir: Path, serving_dir: Path, profiles: Path
) -> None:
    """The lease ends at once (Goodbye naming why), production serves on, and the host lends itself again after
    a wait (each failure in a row doubles it: a job whose engine never starts cannot cost a start a second)."""
    path = write_config(tmp_path / "executor.toml", policy_dir, serving_dir, free_port(), profiles,
                        lend_retry_s=0.5, **memory_settings(policy_dir, serving_dir))
    launcher = FirstRolloutFails(MODELS)
    server, peer, agent, task = start_agent(path, "ex-4", launcher)
    try:
        await peer.arrival(Hello, timeout=10)
        peer.send(Welcome(controller_id="job-a", heartbeat_interval_s=0.3, stall_timeout_s=5.0))
        goodbye = await peer.arrival(Goodbye, timeout=30)
        assert "did not start" in goodbye.reason and "ran out of memory" in goodbye.reason
        params = SamplingParams(max_tokens=4, temperature=0.0)
        assert (await launcher.engines[0].generate("prod-1", [3, 4, 5], params)).token_ids
        assert not task.done()
        await peer.arrival(Hello, timeout=10)  # after 0.5 s x 2
        assert (agent.lent_to, agent.leases) == ("", 1)
        peer.send(Welcome(controller_id="job-a", heartbeat_interval_s=0.3, stall_timeout_s=5.0))
        register = await peer.arrival(Register, timeout=30)
        assert register.executor_id == "ex-4" and agent.lent_to == "job-a"
    finally:
        agent.request_stop("test over")
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)
        server.close()


async def test_a_host_measures_its_slo_on_production_served_before_any_lease(
    tmp_path: Path, policy_dir: Path, serving_dir: Path, profiles: Path
) -> None:
    """``[slo] from_alone``: production served while no job holds the host sets its SLO (the serving engine's
    observer between leases is the calibration); the first lease lends at once, by those budgets, and says how
    they were set."""
    from rose_executor import metrics

    metrics.SLO_TTFT_BUDGET.set(0)
    path = write_config(tmp_path / "alone.toml", policy_dir, serving_dir, free_port(), profiles,
                        slo={"ttft_ms": 2000.0, "tpot_ms": 400.0, "from_alone": 2.0, "calibration_requests": 3},
                        **memory_settings(policy_dir, serving_dir))
    launcher = FakeEngineLauncher(MODELS)
    server, peer, agent, task = start_agent(path, "ex-1", launcher)
    try:
        await peer.arrival(Hello, timeout=30)  # production is up, no job yet
        serving = launcher.engines[0]
        for _ in range(3):
            await serving.generate(f"alone-{next(_requests)}", [9, 8, 7], SamplingParams(max_tokens=4))
        budget_s = metrics.SLO_TTFT_BUDGET._value.get()
        assert budget_s > 0  # measured before any lease
        peer.send(Welcome(controller_id="job", heartbeat_interval_s=0.3, stall_timeout_s=5.0))
        await peer.arrival(Register, timeout=60)
        beat = await peer.arrival(Heartbeat, timeout=10)
        assert beat.load.slo_ttft_ms == pytest.approx(budget_s * 1e3)
        assert "2 x serving alone's p99 over 3 production requests" in beat.load.slo_basis
        peer.send(turn("lent"))
        result = await peer.arrival(TurnResult, where=lambda r: r.turn_id == "lent")
        assert result.output_token_ids.size  # no request left to measure: the guard lends from the first turn
        assert launcher.engines[1].calls[:2] == ["check_weights", "lower_cpu_priority(19)"]  # [rollout] nice
    finally:
        agent.request_stop("test over")
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)
        server.close()


async def test_a_hung_rollout_engine_ends_the_lease_within_its_call_timeout(
    tmp_path: Path, policy_dir: Path, serving_dir: Path, profiles: Path
) -> None:
    """A rollout engine that stops answering (its process SIGSTOPped): the guard's next call into it times out
    after ``rollout.call_timeout_s``, the lease ends naming the call, the engine is stopped, production serves
    on. Without the bound the guard's loop waited forever."""
    path = write_config(tmp_path / "executor.toml", policy_dir, serving_dir, free_port(), profiles,
                        rollout={"call_timeout_s": 0.5}, **memory_settings(policy_dir, serving_dir))
    async with twin(path) as executor:
        peer, rollout = executor.controller, executor.launcher.engines[1]

        async def hang(*_args: object, **_kwargs: object) -> None:
            await asyncio.Event().wait()

        rollout.resume = hang  # type: ignore[method-assign]
        peer.send(turn("t1"))
        goodbye = await peer.arrival(Goodbye, timeout=10)
        assert "did not resume within 0.5 s (rollout.call_timeout_s): it hangs" in goodbye.reason
        assert (await executor.serve([3, 4, 5], 4)).token_ids
        await peer.arrival(Hello, timeout=10)
        assert rollout.shut_down and not executor.task.done()


@pytest.fixture
def keeping_config(tmp_path: Path, policy_dir: Path, serving_dir: Path, profiles: Path) -> Path:
    """A serving host that pre-deploys its policy and keeps it between leases."""
    return write_config(tmp_path / "executor.toml", policy_dir, serving_dir, free_port(), profiles,
                        rollout={"keep_between_leases": True}, **memory_settings(policy_dir, serving_dir))


async def end_and_welcome_again(executor: TwinExecutor, job: str, policy: str = "") -> Register:
    """The job releases the host; the next job (``job``) welcomes it; its registration."""
    peer = executor.controller
    peer.send(m.Release(reason="job done"))
    await peer.arrival(Goodbye, timeout=10)
    await peer.arrival(Hello, timeout=10)
    peer.send(Welcome(controller_id=job, heartbeat_interval_s=0.3, stall_timeout_s=5.0, policy_model_dir=policy))
    return await peer.arrival(Register, timeout=30)


async def test_a_kept_policy_is_pre_deployed_and_each_next_job_activates_it_instead_of_starting_an_engine(
    keeping_config: Path,
) -> None:
    """``keep_between_leases``: the rollout engine starts with production, inactive (paused); every lease
    activates it (resume) and ends by making it inactive again, holding its memory on CPU (the gauges say so).
    Its weights are the policy's own until a job writes into them; after that the next job gets it registered
    at version -1 (its weights forgotten: its first version comes whole, no turn runs before it)."""
    async with twin(keeping_config) as executor:
        peer, (serving, rollout) = executor.controller, executor.launcher.engines
        assert executor.register.weight_version == 0
        # checked at its start (it could be patched), at the rollout side's CPU priority, made inactive, activated
        # by the first lease
        assert rollout.calls[:4] == ["check_weights", "lower_cpu_priority(19)", "pause(keep=False, clear_cache=True)",
                                     "resume"]
        peer.send(turn("a1"))
        assert (await peer.arrival(TurnResult, where=lambda r: r.turn_id == "a1")).output_token_ids.size
        register = await end_and_welcome_again(executor, "job-b")
        assert register.weight_version == 0 and len(executor.launcher.engines) == 2 and not rollout.shut_down
        made_inactive = [i for i, call in enumerate(rollout.calls) if call == "pause(keep=False, clear_cache=True)"]
        assert len(made_inactive) == 2 and rollout.calls[made_inactive[1] + 1] == "resume"
        peer.send(WeightAnnounce(version=1, step=1, source=f"tcp://127.0.0.1:{free_port()}"))  # job B writes
        assert not (await peer.arrival(WeightApplied, timeout=60, where=lambda w: w.version == 1)).ok
        peer.send(m.Release(reason="job B done"))
        await peer.arrival(Goodbye, timeout=10)
        await peer.arrival(Hello, timeout=10)
        assert lease_gauges()[:2] == (0, rollout_engine_bytes(load_executor_config(keeping_config), Device("cpu"),
                                                             register.models[1].path))
        peer.send(Welcome(controller_id="job-c", heartbeat_interval_s=0.3, stall_timeout_s=5.0))
        register = await peer.arrival(Register, timeout=30)
        assert register.weight_version == -1 and rollout.weights.version == -1 and not serving.shut_down
        peer.send(turn("c1"))  # version 0: not what it holds
        assert (await peer.arrival(TurnAborted, where=lambda a: a.turn_id == "c1")).reason == "version"


async def test_a_kept_policy_gives_way_to_another_and_a_failed_lease_does_not_keep_it(
    keeping_config: Path, tmp_path: Path, policy_dir: Path
) -> None:
    """A job naming another policy gets a fresh engine (the kept one stopped first: its memory goes to the new
    one); a rollout engine that died is stopped, never kept."""
    async with twin(keeping_config) as executor:
        kept = executor.launcher.engines[1]
        other = tmp_path / "policy-b"
        shutil.copytree(policy_dir, other)
        register = await end_and_welcome_again(executor, "job-b", str(other))
        assert kept.shut_down and executor.launcher.engines[2].spec.model_dir == other
        assert register.weight_version == 0
        fresh = executor.launcher.engines[2]
        fresh.errored = True
        assert "rollout engine died" in (await executor.controller.arrival(Goodbye, timeout=10)).reason
        await executor.controller.arrival(Hello, timeout=10)
        assert fresh.shut_down and lease_gauges()[:2] == (0, 0)
