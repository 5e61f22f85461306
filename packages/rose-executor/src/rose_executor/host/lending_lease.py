"""The record that a serving host is lent to one RL job: one lease file per serving endpoint on this host.

Invariant: at most one live executor holds the lease of a serving endpoint (``host:port``), and its file
names the holder (executor id, pid, the controller address it lends to). That process serves the endpoint
and lends it to one RL job at a time; another executor started for the same endpoint finds the lease held by
a live process and is refused with the holder's name. A lease whose holder died is stale and taken over. Created
atomically (``O_EXCL``), removed by its holder on the way out.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from rose_core.support.errors import RoseError

LEASE_DIR_ENV = "ROSE_LEASE_DIR"


@dataclass(frozen=True, slots=True)
class Holder:
    executor_id: str
    controller: str
    controller_id: str
    pid: int = 0
    since: float = 0.0


class AlreadyLent(RoseError):
    """The serving endpoint is lent to another RL job; the message names its holder and the fix."""


def lease_dir() -> Path:
    return Path(os.environ.get(LEASE_DIR_ENV) or f"/tmp/rose-leases-{os.getuid()}")


class LendingLease:
    def __init__(self, endpoint: str, directory: Path | None = None) -> None:
        self.endpoint = endpoint
        safe = endpoint.replace("/", "_").replace(":", "_").replace("[", "").replace("]", "")
        self.path = (directory or lease_dir()) / f"serving-{safe}.json"
        self._held = False
        self._owner = ""

    def acquire(self, holder: Holder) -> None:
        """Hold the lease for ``holder`` (this process), or raise ``AlreadyLent`` naming the live holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = json.dumps(asdict(Holder(holder.executor_id, holder.controller, holder.controller_id,
                                          os.getpid(), time.time())))
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                current = self.holder()
                mine = current is not None and (current.pid, current.executor_id) == (os.getpid(), holder.executor_id)
                if current is not None and not mine and psutil.pid_exists(current.pid):
                    raise AlreadyLent(_refusal(self.endpoint, current)) from None
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()  # stale: its holder is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(record)
            self._held, self._owner = True, holder.executor_id
            return
        raise RoseError(f"could not take the lending lease {self.path}: remove it if no executor runs")

    def holder(self) -> Holder | None:
        try:
            return Holder(**json.loads(self.path.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def release(self) -> None:
        if self._held:
            current = self.holder()
            if current is not None and current.pid == os.getpid() and current.executor_id == self._owner:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            self._held = False


def _refusal(endpoint: str, holder: Holder) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.since))
    return (f"the serving host {endpoint} is held by rose-executor {holder.executor_id} (pid {holder.pid}) since "
            f"{since}, which lends it to the RL jobs at {holder.controller}: one process lends a serving endpoint, "
            f"to one RL job at a time; stop that one first (or take it back from its job: rose-executor revoke "
            f"{holder.executor_id}), or serve another endpoint (`port` under [serving])")
