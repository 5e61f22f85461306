"""`rose-transfer relay` as an operator runs it: a process of its own between a publisher and its cluster."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rose_core.protocol.auth import weights_key
from rose_core.support.metrics import free_port
from rose_transfer import SparsePublisher, WeightFetcher, load_arrays

from .conftest import SECRET, assert_same, random_state_dict


def relay_command(secret: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "rose_transfer", "relay", "--secret-file", str(secret), *args]


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
async def test_it_relays_versions_reports_what_crossed_and_stops_on_sigterm(
    secret: Path, tmp_path: Path, scheme: str
) -> None:
    """With a ``tls://`` upstream (``[controller] weights_tls``) the relay serves TLS too. Given the secret file,
    the relay works with the weights key derived from it, as the publisher and receivers of `rose run` do."""
    port = free_port()
    with SparsePublisher(secret=weights_key(SECRET), host="127.0.0.1", port=port, tls=scheme == "tls") as publisher:
        relay = subprocess.Popen(relay_command(secret, "--upstream", publisher.source, "--progress-every", "0.1",
                                               "--json"), stdout=subprocess.PIPE, text=True)
        try:
            started = json.loads(relay.stdout.readline())  # type: ignore[union-attr]
            tensors = random_state_dict(3)
            announce = publisher.publish(1, 1, tensors)
            fetched = await WeightFetcher(weights_key(SECRET), "r-1").fetch(announce, -1, tmp_path / "v1",
                                                                            relay=started["source"])
            progress = json.loads(relay.stdout.readline())  # type: ignore[union-attr]
            relay.send_signal(signal.SIGTERM)
            out, _ = relay.communicate(timeout=30)
        finally:
            if relay.poll() is None:
                relay.kill()
    assert (started["event"], started["upstream"]) == ("started", publisher.source)
    assert started["source"].startswith(f"{scheme}://127.0.0.1:")
    assert_same(load_arrays(fetched), tensors)
    assert progress["event"] == "progress" and progress["upstream_bytes"] > 0
    assert relay.returncode == 0
    # progress is printed whenever the count grew (the manifest, then the buckets): the first line read may be the
    # manifest's alone, so the count it stops with is the last progress line's
    later = [json.loads(line) for line in out.splitlines()]
    last = [e for e in [progress, *later] if e["event"] == "progress"][-1]
    assert later[-1] == {"event": "stopped", "upstream_bytes": last["upstream_bytes"]}


def test_it_says_what_it_relays_in_words(secret: Path) -> None:
    upstream = f"tcp://127.0.0.1:{free_port()}"
    relay = subprocess.Popen(relay_command(secret, "--upstream", upstream, "--relay-id", "relay-east"),
                             stdout=subprocess.PIPE, text=True)
    try:
        line = relay.stdout.readline()  # type: ignore[union-attr]
        relay.send_signal(signal.SIGINT)
        rest, _ = relay.communicate(timeout=30)
    finally:
        if relay.poll() is None:
            relay.kill()
    assert line.startswith("relay relay-east: serving tcp://127.0.0.1:") and line.rstrip().endswith(upstream)
    assert relay.returncode == 0 and rest.rstrip().endswith("relay stopped: 0.00 MB crossed the link from upstream")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--upstream", "ucx://10.0.0.1:7000"], "--upstream is the publisher's tcp://host:port (or tls://host:port), not 'ucx://10.0.0.1:7000'"),
        (["--upstream", "tcp://127.0.0.1:1", "--secret-file", "/nonexistent/secret"], "/nonexistent/secret"),
    ],
)
def test_bad_arguments_are_one_clear_error_and_exit_2(secret: Path, args: list[str], message: str) -> None:
    done = subprocess.run(relay_command(secret, *args), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rose-transfer: error: ") and message in last
