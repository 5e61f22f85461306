"""One RL job per serving host: the lending lease of a serving endpoint, held by one live executor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rose_executor.host.lending_lease import AlreadyLent, Holder, LendingLease


def test_a_second_process_is_refused_with_the_holders_name_and_the_fix(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lease = LendingLease("127.0.0.1:8000", tmp_path)
        lease.path.parent.mkdir(parents=True, exist_ok=True)
        lease.path.write_text(json.dumps({"executor_id": "serving-0", "controller": "tcp://10.0.0.1:5555",
                                          "controller_id": "job-a", "pid": other.pid, "since": 0.0}))
        with pytest.raises(AlreadyLent) as refused:
            LendingLease("127.0.0.1:8000", tmp_path).acquire(Holder("serving-9", "tcp://10.0.0.2:5555", "job-b"))
        message = str(refused.value)
        assert "which lends it to the RL jobs at tcp://10.0.0.1:5555" in message
        assert f"held by rose-executor serving-0 (pid {other.pid})" in message
        assert "rose-executor revoke serving-0" in message and "`port` under [serving]" in message
    finally:
        other.kill()
        other.wait()
    # its holder is gone now: the lease is stale and taken over
    taker = LendingLease("127.0.0.1:8000", tmp_path)
    taker.acquire(Holder("serving-9", "tcp://10.0.0.2:5555", "job-b"))
    held = taker.holder()
    assert held is not None and (held.executor_id, held.controller_id) == ("serving-9", "job-b")
    taker.release()
    assert not taker.path.exists()


def test_one_executor_takes_its_own_lease_again_and_releases_only_its_own(tmp_path: Path) -> None:
    first = LendingLease("h:1", tmp_path)
    first.acquire(Holder("ex-1", "c", "ctl"))
    first.acquire(Holder("ex-1", "c", "ctl"))  # the same executor again: fine
    with pytest.raises(AlreadyLent, match="rose-executor ex-1"):
        LendingLease("h:1", tmp_path).acquire(Holder("ex-2", "c2", "ctl-2"))  # another executor, same process
    LendingLease("h:1", tmp_path).release()  # never held: leaves the holder's lease alone
    assert first.path.exists()
    first.release()
    assert not first.path.exists()
