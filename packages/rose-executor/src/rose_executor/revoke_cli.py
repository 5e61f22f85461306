"""``rose-executor revoke``: the serving owner takes a lent host back from the RL job.

It signals the executor (SIGUSR1), which reports itself revoked to the controller at once and gives its
rollout turns back; serving goes on. The executor is found on this host by its ``--executor-id`` (or named
by ``--pid``).
"""

from __future__ import annotations

import json
import os
import signal

import click
import psutil

from rose_core.support.errors import RoseError


def find_executor(executor_id: str) -> list[int]:
    """PIDs of this host's ``rose-executor`` processes started with ``--executor-id executor_id``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info.get("cmdline") or []
        if not any("rose_executor" in a or "rose-executor" in a for a in argv[:3]):
            continue
        if _option(argv, "--executor-id") == executor_id and proc.info["pid"] != os.getpid():
            found.append(int(proc.info["pid"]))
    return found


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def revoke_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        raise RoseError(f"no process {pid} on this host: check --pid") from None
    except PermissionError:
        raise RoseError(f"not allowed to signal process {pid}: run as the executor's user") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("executor_id", required=False)
@click.option("--pid", type=int, default=None, help="Signal this process instead of finding EXECUTOR_ID.")
@click.option("--json", "as_json", is_flag=True, help="Print what was signalled as JSON.")
def revoke(executor_id: str | None, pid: int | None, as_json: bool) -> None:
    """Take the serving executor EXECUTOR_ID on this host back from its RL job.

    Its rollout turns are handed back and re-routed by the controller; serving continues; the executor
    takes no more rollout work until it is restarted."""
    if (executor_id is None) == (pid is None):
        raise click.UsageError("name the executor: EXECUTOR_ID (its --executor-id) or --pid")
    pids = [pid] if pid is not None else find_executor(executor_id or "")
    if not pids:
        raise RoseError(f"no rose-executor with --executor-id {executor_id} runs on this host: "
                        "check the id (`ps -ef | grep rose_executor`) or pass --pid")
    for target in pids:
        revoke_pid(target)
    if as_json:
        click.echo(json.dumps({"executor_id": executor_id, "signalled": pids}))
    else:
        click.echo(f"revoked {executor_id or 'process'}: sent SIGUSR1 to pid {', '.join(map(str, pids))}")
