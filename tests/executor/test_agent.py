"""The executor agent end to end: its CLI as a subprocess against a real ControlServer played by the test."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
import numpy as np
import openai
import psutil
import pytest
import torch
from safetensors.torch import load_file

from faulty_proxy import FaultyProxy
from rose_core.protocol.auth import Signer, weights_key
from rose_core.protocol.engine_layout import EngineLayout
from rose_core.protocol.messages import (
    CancelTurn,
    FromController,
    Goodbye,
    Heartbeat,
    Hello,
    Register,
    SamplingParams,
    StepStarted,
    TurnAborted,
    TurnResult,
    WeightAnnounce,
    WeightApplied,
    Welcome,
)
from rose_core.protocol.wire import Framer
from rose_core.support.metrics import free_port
from rose_core.support.metrics_server import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from rose_transfer import SparsePublisher
from rose_transfer.wire.loop_thread import LoopThread

from .conftest import SECRET
from .controller_peer import ControllerPeer
from .executor_setup import LONG, ROLLOUT_SEQ_BYTES, memory_settings, turn, write_config


@dataclass
class Executor:
    process: subprocess.Popen[bytes]
    controller: ControllerPeer
    register: Register
    children: set[int]


def executor_command(controller: str, role: str, config: Path, secret_file: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "rose_executor",
        "--controller", controller, "--role", role, "--config", str(config),
        "--secret-file", str(secret_file), "--metrics-port", "0", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "secret"
    path.write_bytes(SECRET)
    return path


@pytest.fixture(scope="module")
def executor(
    tmp_path_factory: pytest.TempPathFactory, policy_dir: Path, serving_dir: Path, secret_file: Path
) -> Iterator[Executor]:
    root = tmp_path_factory.mktemp("executor")
    memory = memory_settings(policy_dir, serving_dir)
    config = write_config(root / "executor.toml", policy_dir, serving_dir, free_port(), **memory)
    controller = ControllerPeer(SECRET)
    command = executor_command(controller.address, "serving", config, secret_file, "--executor-id", "ex-1")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sys.stderr, env=os.environ.copy())
    try:
        hello = controller.expect(Hello, timeout=60)
        assert (hello.peer_id, hello.kind) == ("ex-1", "executor")
        controller.send(Welcome(controller_id="test-controller", heartbeat_interval_s=0.3, stall_timeout_s=5.0))
        started = time.perf_counter()
        register = controller.expect(Register, timeout=180)
        print(f"\nexecutor (serving role, 2 engines) ready {time.perf_counter() - started:.1f} s after Welcome")
        children = {p.pid for p in psutil.Process(process.pid).children(recursive=True)}
        yield Executor(process, controller, register, children)
    finally:
        stop(process)
        controller.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop an executor left running by a failed test the way an operator would (SIGTERM), then harder."""
    if process.poll() is not None:
        return
    family = psutil.Process(process.pid).children(recursive=True)
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
    for child in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def test_register_describes_the_host(executor: Executor, policy_dir: Path) -> None:
    reg = executor.register
    assert (reg.executor_id, reg.role, reg.device, reg.weight_version) == ("ex-1", "serving", "cpu", 0)
    assert reg.rollout_capacity == 2
    assert [(m.purpose, m.name) for m in reg.models] == [("serving", "prod"), ("rollout", "policy")]
    assert reg.models[1].parameters > 0 and reg.models[1].kv_bytes_per_token == 512
    assert reg.serving_endpoint.startswith("http://127.0.0.1:") and reg.serving_endpoint.endswith("/v1")
    assert reg.metrics_endpoint.startswith("http://127.0.0.1:")
    assert reg.memory_bytes > 1 << 30
    assert len(executor.children) >= 2  # engine-core processes (and their workers)


def test_heartbeats_carry_the_load(executor: Executor) -> None:
    peer = executor.controller
    first = peer.expect(Heartbeat, timeout=5)
    second = peer.expect(Heartbeat, timeout=5)
    assert second.seq > first.seq and second.executor_id == "ex-1"
    load = second.load
    assert (load.weight_version, load.rollout_capacity, load.slo_headroom, load.state) == (0, 2, True, "ready")


def test_serving_endpoint_serves_and_is_observed(executor: Executor) -> None:
    client = openai.OpenAI(base_url=executor.register.serving_endpoint, api_key="unused", max_retries=0)
    done = client.completions.create(model="prod", prompt=[5, 6, 7], max_tokens=4, temperature=0.0)
    assert done.usage is not None and done.usage.completion_tokens >= 1
    peer = executor.controller
    beat = peer.expect(Heartbeat, timeout=5, where=lambda h: h.load.serving_requests_total >= 1)
    assert beat.load.serving_ttft_p99_ms > 0 and beat.load.serving_tpot_p99_ms > 0
    assert beat.load.serving_requests_in_flight == 0 and beat.load.serving_slo_violations_total >= 1


def test_rollout_waits_for_serving_headroom(executor: Executor) -> None:
    peer = executor.controller
    client = openai.OpenAI(base_url=executor.register.serving_endpoint, api_key="unused", max_retries=0)
    client.completions.create(model="prod", prompt=[9, 8, 7], max_tokens=4, temperature=0.0)
    peer.send(turn("held"))
    beat = peer.expect(Heartbeat, timeout=5, where=lambda h: h.load.state == "held")
    assert not beat.load.slo_headroom and beat.load.rollout_in_flight == 1
    result = peer.expect(TurnResult, where=lambda r: r.turn_id == "held")
    assert result.queue_seconds > 0.5  # held until the violating samples left the 2 s window
    peer.expect(Heartbeat, timeout=5, where=lambda h: h.load.slo_headroom and h.load.state == "ready")


def test_turn_result_carries_the_version(executor: Executor) -> None:
    peer = executor.controller
    peer.send(turn("t1"))
    result = peer.expect(TurnResult, where=lambda r: r.turn_id == "t1")
    assert (result.executor_id, result.weight_version, result.attempt) == ("ex-1", 0, 0)
    assert result.output_token_ids.dtype == np.int32 and result.output_logprobs.dtype == np.float32
    assert 1 <= len(result.output_token_ids) == len(result.output_logprobs) <= 10
    assert result.finish_reason in ("length", "stop") and result.run_seconds > 0
    beat = peer.expect(Heartbeat, timeout=5)
    assert "traj-t1" in beat.load.warm_trajectories
    assert beat.load.rollout_tokens_total >= len(result.output_token_ids)


def test_wrong_version_and_capacity_are_refused(executor: Executor) -> None:
    peer = executor.controller
    peer.send(turn("t-v5", version=5))
    aborted = peer.expect(TurnAborted, where=lambda a: a.turn_id == "t-v5")
    assert aborted.reason == "version"
    long = SamplingParams(max_tokens=200, temperature=0.0)
    for name in ("c1", "c2", "c3"):
        peer.send(turn(name, sampling=long))
    refused = peer.expect(TurnAborted, where=lambda a: a.turn_id == "c3")
    assert refused.reason == "capacity"
    for name in ("c1", "c2"):
        peer.expect(TurnResult, where=lambda r, name=name: r.turn_id == name)


def test_cancel_turn_gets_no_reply(executor: Executor) -> None:
    peer = executor.controller
    peer.send(turn("x1", sampling=SamplingParams(max_tokens=900, temperature=0.0)))
    peer.expect(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 1)
    peer.send(CancelTurn(turn_id="x1", attempt=0))
    peer.quiet_for(1.5, where=lambda m: getattr(m, "turn_id", "") == "x1")
    peer.expect(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 0)


def test_prefix_hits_are_reported(executor: Executor) -> None:
    peer = executor.controller
    prompt = np.arange(300, dtype=np.int32) % 150 + 3  # 300 tokens: the full KV blocks can be reused
    peer.send(turn("p1", prompt=prompt))
    first = peer.expect(TurnResult, where=lambda r: r.turn_id == "p1")
    peer.send(turn("p2", prompt=prompt))
    second = peer.expect(TurnResult, where=lambda r: r.turn_id == "p2")
    assert first.prefix_hit_tokens == 0 and 0 < second.prefix_hit_tokens < len(prompt)
    print(f"\nprefix hit: {second.prefix_hit_tokens} of {len(prompt)} prompt tokens on the second turn")


def test_memory_cut_aborts_and_freezes_until_the_next_step(executor: Executor) -> None:
    """Serving traffic crosses the high watermark: one 2x cut, the youngest rollout turn that no longer fits
    is given back as ``memory``, the budget stays frozen (new long turns refused) until StepStarted."""
    peer = executor.controller
    for name in ("m1", "m2"):
        peer.send(turn(name, sampling=LONG))
    peer.expect(
        Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 2 and not h.load.rollout_budget_frozen
    )
    client = openai.OpenAI(base_url=executor.register.serving_endpoint, api_key="unused", max_retries=0)
    client.completions.create(model="prod", prompt=[4, 5, 6], max_tokens=300, temperature=0.0)
    aborted = peer.expect(TurnAborted, timeout=10, where=lambda a: a.turn_id in ("m1", "m2"))
    assert aborted.reason == "memory"
    survivor = "m2" if aborted.turn_id == "m1" else "m1"
    assert peer.expect(Heartbeat, timeout=5).load.rollout_budget_frozen
    peer.send(turn("m3", sampling=LONG))  # one long turn already holds the whole cut budget
    assert peer.expect(TurnAborted, where=lambda a: a.turn_id == "m3").reason == "memory"
    peer.expect(TurnResult, where=lambda r: r.turn_id == survivor)
    peer.send(StepStarted(step=1, weight_version=0))
    peer.expect(Heartbeat, timeout=5, where=lambda h: not h.load.rollout_budget_frozen)
    peer.send(turn("m4", sampling=LONG))
    peer.expect(TurnResult, where=lambda r: r.turn_id == "m4")


def test_weight_update_through_rose_transfer(executor: Executor, policy_dir: Path) -> None:
    """Two versions into the live engine: whole, then patches in place; a running turn finishes on its
    version (nothing aborted), and the engine's digest is the published one each time."""
    peer = executor.controller
    peer.send(turn("w0"))
    before = peer.expect(TurnResult, where=lambda r: r.turn_id == "w0")
    state = load_file(str(policy_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(1)
    new = {k: (v.float() + 0.05 * torch.randn(v.shape, generator=generator)).to(v.dtype) for k, v in state.items()}
    newer = {k: v.clone() for k, v in new.items()}
    newer["model.layers.0.self_attn.v_proj.weight"][0, :4] += 0.5
    layout = EngineLayout(tie_word_embeddings=False)
    publisher = SparsePublisher(secret=weights_key(SECRET), host="127.0.0.1", port=0)
    try:
        peer.send(turn("busy", sampling=SamplingParams(max_tokens=200, temperature=0.0)))
        peer.expect(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 1)
        first = publisher.publish(1, step=1, tensors=new, layout=layout)
        peer.send(first)
        applied = peer.expect(WeightApplied, timeout=60)
        busy = peer.expect(TurnResult, where=lambda r: r.turn_id == "busy")
        second = publisher.publish(2, step=2, tensors=newer, layout=layout)
        peer.send(second)
        patched = peer.expect(WeightApplied, timeout=60, where=lambda w: w.version == 2)
    finally:
        publisher.close()
    assert (applied.ok, applied.version, applied.error, applied.full_sync) == (True, 1, "", True)
    assert applied.weights_digest == first.manifest_digest
    assert applied.bytes_received >= sum(t.numel() * 2 for t in new.values())
    assert busy.weight_version == 0 and applied.aborted_turns == 0  # it finished on its version
    assert (patched.ok, patched.full_sync, patched.tensors_changed) == (True, False, 1)
    assert patched.weights_digest == second.manifest_digest
    assert patched.bytes_received < first.total_bytes // 10
    print(f"\nversion 1 (whole) applied in {applied.seconds:.3f} s, version 2 (patches, "
          f"{patched.bytes_received} bytes) in {patched.seconds:.3f} s")
    peer.send(turn("w2", version=2))
    after = peer.expect(TurnResult, where=lambda r: r.turn_id == "w2")
    assert after.weight_version == 2
    changed = (after.output_token_ids.tolist(), after.output_logprobs.tolist())
    assert changed != (before.output_token_ids.tolist(), before.output_logprobs.tolist())
    peer.send(turn("old", version=0))
    assert peer.expect(TurnAborted, where=lambda a: a.turn_id == "old").reason == "version"


def test_failed_fetch_keeps_the_version(executor: Executor) -> None:
    peer = executor.controller
    peer.send(WeightAnnounce(version=3, step=3, source=f"tcp://127.0.0.1:{free_port()}"))
    failed = peer.expect(WeightApplied, timeout=60, where=lambda w: w.version == 3)
    assert not failed.ok and "cannot fetch weight version 3" in failed.error
    peer.send(StepStarted(step=2, weight_version=2))
    beat = peer.expect(Heartbeat, timeout=5)
    assert beat.load.weight_version == 2 and beat.load.state == "ready"


def test_prometheus_metrics(executor: Executor) -> None:
    samples = metric_samples(executor)
    assert samples['rose_executor_rollout_turns_total{outcome="ok"}'] >= 5
    assert samples['rose_executor_rollout_turns_total{outcome="version"}'] >= 2
    assert samples['rose_executor_rollout_turns_total{outcome="capacity"}'] >= 1
    assert samples["rose_executor_rollout_tokens_total"] > 0
    assert samples["rose_executor_weight_version"] == 2
    assert samples["rose_executor_weight_apply_seconds_count"] == 2
    assert samples["rose_executor_serving_ttft_seconds_count"] >= 2
    assert samples["rose_executor_serving_tpot_seconds_count"] >= 2
    assert samples["rose_executor_serving_slo_violations_total"] >= 2
    assert 0 <= samples["rose_executor_serving_slo_attainment_ratio"] < 1
    assert samples['rose_executor_rollout_turns_total{outcome="memory"}'] >= 2
    assert samples["rose_executor_rollout_budget_cuts_total"] == 1
    assert samples["rose_executor_rollout_budget_frozen"] == 0
    assert samples["rose_executor_rollout_budget_bytes"] >= 2 * ROLLOUT_SEQ_BYTES
    assert samples["rose_executor_rollout_prefix_hit_tokens_total"] > 0
    assert 0 < samples["rose_executor_rollout_prefix_hit_ratio"] < 1
    assert samples["rose_executor_guard_holds_total"] >= 1  # serving traffic under a 1 us SLO held the rollout


def test_idle_connections_to_the_metrics_endpoint_cost_production_no_threads(executor: Executor) -> None:
    """2,000 connections held open and silent on the serving host's metrics endpoint (a scanner, a hostile peer)
    grow the production process by at most ``MAX_CONNECTIONS`` threads, and production requests are answered
    all the while (their latency beside the unloaded one is printed; no timed assertion)."""
    host_process = psutil.Process(executor.process.pid)
    client = openai.OpenAI(base_url=executor.register.serving_endpoint, api_key="unused", max_retries=0)

    def answered_in() -> float:
        started = time.perf_counter()
        done = client.completions.create(model="prod", prompt=[5, 6, 7], max_tokens=4, temperature=0.0)
        assert done.usage is not None and done.usage.completion_tokens >= 1
        return time.perf_counter() - started

    alone = sorted(answered_in() for _ in range(5))[2]
    threads_before = host_process.num_threads()
    address = executor.register.metrics_endpoint.removeprefix("http://").split("/")[0].rsplit(":", 1)
    held: list[socket.socket] = []
    refused_before = metric_samples(executor)["rose_metrics_refused_connections_total"]
    holding = time.monotonic()
    try:
        for _ in range(2000):
            held.append(socket.create_connection((address[0], int(address[1])), timeout=10))
        most = max(host_process.num_threads() for _ in range(20))
        loaded = sorted(answered_in() for _ in range(5))[2]
        most = max(most, host_process.num_threads())
        held_s = time.monotonic() - holding
    finally:
        for s in held:
            s.close()
    print(f"\nproduction completion, median of 5: {alone * 1e3:.0f} ms alone, {loaded * 1e3:.0f} ms with 2,000 idle "
          f"metrics connections; threads {threads_before} -> at most {most}")
    assert most - threads_before <= MAX_CONNECTIONS
    deadline = time.monotonic() + 15
    while True:  # the endpoint answers again once the held slots are closed or timed out
        with contextlib.suppress(httpx.TransportError):
            if "rose_metrics_refused_connections_total" in httpx.get(executor.register.metrics_endpoint).text:
                break
        assert time.monotonic() < deadline, "the metrics endpoint did not answer again"
        time.sleep(0.2)
    served = MAX_CONNECTIONS * (1 + int(held_s / REQUEST_TIMEOUT_S))  # each slot frees after the timeout at most
    assert metric_samples(executor)["rose_metrics_refused_connections_total"] - refused_before >= 2000 - served


def test_a_replayed_controller_message_is_rejected_and_counted(executor: Executor) -> None:
    """A turn request as the controller sealed it, played again: run once; the copy is refused and counted."""
    peer, server = executor.controller, executor.controller.server
    version = peer.expect(Heartbeat, timeout=5).load.weight_version
    frames = server.seal(peer.peer, turn("once", version=version))  # type: ignore[attr-defined]
    server.send_frames(peer.peer, frames)  # type: ignore[attr-defined]
    assert peer.expect(TurnResult, where=lambda r: r.turn_id == "once").output_token_ids.size > 0
    replays = 'rose_rejected_messages_total{reason="replay"}'
    before = metric_samples(executor).get(replays, 0.0)
    server.send_frames(peer.peer, frames)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while metric_samples(executor).get(replays, 0.0) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric_samples(executor).get(replays, 0.0) == before + 1
    peer.quiet_for(2, lambda msg: isinstance(msg, TurnResult) and msg.turn_id == "once")


def test_a_forged_unsigned_notice_changes_nothing(executor: Executor) -> None:
    """Anyone can send an unsigned notice: the executor shows it and does not act on it (no rejoin)."""
    peer = executor.controller
    forged = Framer(Signer(b"x" * 32), FromController).notice("no_handshake", "send Hello before anything else")
    peer.server.send_frames(peer.peer, forged)  # type: ignore[attr-defined]
    peer.send(turn("after-notice", version=peer.expect(Heartbeat, timeout=5).load.weight_version))
    assert peer.expect(TurnResult, where=lambda r: r.turn_id == "after-notice").output_token_ids.size > 0
    peer.quiet_for(1, lambda msg: isinstance(msg, Hello))


def metric_samples(executor: Executor) -> dict[str, float]:
    text = httpx.get(executor.register.metrics_endpoint, timeout=5).text
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line[:1] != "#"}


def test_sigterm_gives_turns_back_says_goodbye_and_leaves_no_processes(executor: Executor) -> None:
    """The operator's stop (``Shutdown`` from `rose run` takes the same path: the twin and every run test it)."""
    peer = executor.controller
    peer.send(turn("last", version=2, sampling=SamplingParams(max_tokens=900, temperature=0.0)))
    peer.expect(Heartbeat, timeout=5, where=lambda h: h.load.rollout_in_flight == 1)
    executor.process.send_signal(signal.SIGTERM)
    given_back = peer.expect(TurnAborted, where=lambda a: a.turn_id == "last")
    assert given_back.reason == "shutdown"
    goodbye = peer.expect(Goodbye, timeout=10)
    assert goodbye.peer_id == "ex-1" and "SIGTERM" in goodbye.reason
    assert executor.process.wait(timeout=60) == 0
    assert_gone(executor.children)


def assert_gone(pids: set[int], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive == [], f"orphan processes left behind: {alive}"


def start_dedicated(controller: ControllerPeer, config: Path, secret_file: Path, executor_id: str,
                    ) -> tuple[subprocess.Popen[bytes], Register]:
    """A dedicated executor in its own process, registered with ``controller``."""
    command = executor_command(controller.address, "dedicated", config, secret_file, "--executor-id", executor_id)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    controller.expect(Hello, timeout=60, where=lambda h: h.peer_id == executor_id)
    controller.send(Welcome(controller_id="test-controller", heartbeat_interval_s=0.3))
    return process, controller.expect(Register, timeout=120)


def test_an_executor_killed_in_the_middle_of_an_update_comes_back_with_a_full_sync(
    tmp_path: Path, policy_dir: Path, secret_file: Path
) -> None:
    """SIGKILL while version 2 is half pulled into the engine (the publisher's replies stall at half of it):
    the engine goes with the process; a new process registers at version 0, is sent the same announcement,
    pulls the version whole and ends on the trainer's digest. A dedicated executor registers without a serving
    endpoint, always has headroom, and stops on SIGTERM: Goodbye, exit 0, its engine gone."""
    config = tmp_path / "executor.toml"
    config.write_text(f'kv_cache_gib = 0.5\nmax_model_len = 1024\n[rollout]\nmodel_dir = "{policy_dir}"\n')
    state = load_file(str(policy_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(2)
    versions = [{k: (v.float() + scale * torch.randn(v.shape, generator=generator)).to(v.dtype)
                 for k, v in state.items()} for scale in (0.05, 0.1)]
    layout = EngineLayout(tie_word_embeddings=False)
    controller, proxies = ControllerPeer(SECRET), LoopThread("faulty-proxy")
    publisher = SparsePublisher(secret=weights_key(SECRET), host="127.0.0.1", port=0)
    process, again, proxy = None, None, None
    try:
        process, _ = start_dedicated(controller, config, secret_file, "ded-2")
        children = {p.pid for p in psutil.Process(process.pid).children(recursive=True)}
        controller.send(publisher.publish(1, step=1, tensors=versions[0], layout=layout))
        assert controller.expect(WeightApplied, timeout=60, where=lambda w: w.version == 1).ok
        second = publisher.publish(2, step=2, tensors=versions[1], layout=layout)
        half = second.total_bytes // 2
        proxy = proxies.submit(FaultyProxy(int(second.source.rsplit(":", 1)[1]), stalls=[half]).start()).result()
        controller.send(msgspec.structs.replace(second, source=proxy.source))
        controller.expect(Heartbeat, timeout=30, where=lambda h: h.load.state == "updating" and proxy.stalled == 1)
        process.kill()  # in the middle of version 2
        assert process.wait(timeout=30) == -signal.SIGKILL
        assert_gone(children)  # its engine went with it
        again, register = start_dedicated(controller, config, secret_file, "ded-2")
        assert register.weight_version == 0  # a new process holds what it loaded; nothing half-applied survives
        assert (register.role, register.serving_endpoint, [m.purpose for m in register.models]) == (
            "dedicated", "", ["rollout"])
        beat = controller.expect(Heartbeat, timeout=5)
        assert beat.load.slo_headroom and beat.load.serving_requests_total == 0
        controller.send(second)
        applied = controller.expect(WeightApplied, timeout=60, where=lambda w: w.version == 2)
        children = {p.pid for p in psutil.Process(again.pid).children(recursive=True)}
        again.send_signal(signal.SIGTERM)
        goodbye = controller.expect(Goodbye, timeout=10)
        stopped = again.wait(timeout=60)
        assert_gone(children)
    finally:
        for running in (process, again):
            if running is not None:
                stop(running)
        if proxy is not None:
            proxies.submit(proxy.close()).result()
        publisher.close()
        proxies.stop()
        controller.close()
    assert (applied.ok, applied.full_sync, applied.error) == (True, True, "")
    assert applied.weights_digest == second.manifest_digest
    assert applied.bytes_received >= half  # the whole version, not the half the first process had pulled
    assert "SIGTERM" in goodbye.reason and stopped == 0


def test_bad_secret_is_one_clear_error_and_exit_2(tmp_path: Path, policy_dir: Path, serving_dir: Path) -> None:
    controller = ControllerPeer(SECRET)
    try:
        wrong = tmp_path / "wrong-secret"
        wrong.write_bytes(b"not-the-secret-of-this-controller")
        config = write_config(tmp_path / "executor.toml", policy_dir, serving_dir, free_port(), welcome_timeout_s=2.0)
        command = executor_command(controller.address, "dedicated", config, wrong, "--log-level", "WARNING")
        done = subprocess.run(command, check=False, capture_output=True, timeout=60, text=True)
    finally:
        controller.close()
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr
    # the notice is unsigned (the executor cannot check it): shown at once, acted on only by the timeout
    assert any("unsigned notice (cannot be verified)" in line and "unauthenticated" in line for line in lines)
    assert lines[-1].startswith(f"rose-executor: error: no Welcome from the controller at {controller.address} "
                                "within 2 s; it answered with an unsigned notice (unauthenticated)")
    assert "secret" in lines[-1]


def test_no_controller_is_one_clear_error(tmp_path: Path, policy_dir: Path, secret_file: Path) -> None:
    config = tmp_path / "executor.toml"
    config.write_text(f'welcome_timeout_s = 1.0\n[rollout]\nmodel_dir = "{policy_dir}"\n')
    address = f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run(
        executor_command(address, "dedicated", config, secret_file),
        check=False,
        capture_output=True,
        timeout=60,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"rose-executor: error: no Welcome from the controller at {address} within 1 s: "
        "check --controller and that the controller is running (and, if it encrypts, set encrypt_control = true)"
    )


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
