"""`rose run` with the remote cluster's relay a process of its own (`rose-transfer relay`), killed with SIGKILL
while the remote executor pulls a version through it: the executor falls back to the publisher, the job goes
on, and every engine holds the trainer's weights every step. Real processes, real engines; the control plane
encrypted (`[controller] encrypt`), so the executors `rose run` starts connect over CurveZMQ."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from rose_core.protocol.auth import write_new_secret
from rose_core.support.metrics import free_port

from .rose_run_support import LiveRun

STEPS = 4
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[controller]
weights_port = {weights_port}
encrypt = true

[rl]
trainer.lr = 1e-6
max_tokens_per_turn = 24
eval.every = 0

[[clusters]]
name = "remote"
executors = ["serving-0"]
relay = "{relay}"
"""


def relay_command(upstream: str, port: int, secret: Path) -> list[str]:
    return [sys.executable, "-m", "rose_transfer", "relay", "--upstream", upstream, "--port", str(port),
            "--secret-file", str(secret), "--relay-id", "relay-remote", "--progress-every", "0.2", "--json"]


def pulls_through(port: int) -> set[int]:
    """The local ports of the open connections to ``port`` (receivers' pulls, as the kernel sees them)."""
    return {c.laddr.port for c in psutil.net_connections("tcp4")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rose-run-relay-killed")
    secret = work / "secret"
    write_new_secret(secret)
    weights_port, relay_port = free_port(), free_port()
    relay = subprocess.Popen(relay_command(f"tcp://127.0.0.1:{weights_port}", relay_port, secret),
                             stdout=subprocess.PIPE, text=True)
    events: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: events.extend(json.loads(line) for line in relay.stdout), daemon=True)
    try:
        started = json.loads(relay.stdout.readline())  # type: ignore[union-attr]
        reader.start()
        config = CONFIG.format(work=work, weights_port=weights_port, relay=started["source"])
        with LiveRun(work, config, STEPS, args=("--secret-file", str(secret))) as run:
            run.wait_for_row(1)
            run.until("the relay pulling version 1", lambda: any(e.get("upstream_bytes", 0) > 0 for e in events))
            before = pulls_through(relay_port)
            relay.send_signal(signal.SIGSTOP)  # the kernel still accepts connections for it; it answers nothing...
            run.until("a pull through the stopped relay", lambda: pulls_through(relay_port) - before)
            relay.kill()  # ...and dies in the middle of that version
            report = run.finish()
        report["_relay_rc"] = relay.wait(timeout=10)
        reader.join(timeout=10)
        report["_relay_events"], report["_relay_source"] = events, started["source"]
        return report
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()


def test_the_job_finishes_ok_on_the_trainers_weights_every_step(killed: dict[str, Any]) -> None:
    assert killed["ok"], f"{killed['error']}\n{killed['_stderr'][-3000:]}\n{killed['_logs']}"
    assert [s["step"] for s in killed["steps"]] == list(range(1, STEPS + 1))
    assert killed["lost_trajectories"] == 0 and killed["version_mismatches"] == 0
    assert killed["weight_digest_mismatches"] == 0
    for step in killed["steps"]:
        assert all(e["digest_ok"] for e in step["sync_breakdown"]["executors"].values()), step["step"]


def test_the_relay_served_until_it_was_killed_then_the_source_did(killed: dict[str, Any]) -> None:
    assert killed["_relay_rc"] == -signal.SIGKILL
    relayed = [e["upstream_bytes"] for e in killed["_relay_events"] if e["event"] == "progress"]
    assert relayed and relayed[-1] > 0  # version 1 crossed the link to it
    assert f"cluster remote: serving-0 pull weights through {killed['_relay_source']}" in killed["_stdout"]
    assert re.search(r"dashboard: rose-tui --connect tcp://\S+ --secret-file \S+ --encrypt\n", killed["_stdout"])
    log = killed["_log_files"]["executor-serving-0"]
    cut = re.search(r"weight fetch of version (\d+) interrupted \((.*)\); resuming\n(.*)\n", log)
    assert cut, log[-4000:]
    print(f"\nversion {cut[1]}: {cut[2]}; then {cut[3]}")
    assert "Connect call failed" not in cut[2]  # the relay died in the middle of this version's pull...
    assert cut[3].startswith(f"relay {killed['_relay_source']} failed")  # ...then the source served it
    assert cut[3].endswith("; pulling from the source")
