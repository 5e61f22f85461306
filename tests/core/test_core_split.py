"""`rose run`'s split of the machine's cores between the serving hosts and the job (``app/run/core_split``)."""

from __future__ import annotations

import os
import sys

import msgspec
import pytest

from rose_core.app.config import RunConfig
from rose_core.app.run.child_processes import ChildProcesses
from rose_core.app.run.core_split import CoreSplit, core_split
from rose_core.support.cpu_list import cpu_list, parse_cpu_list
from rose_core.support.errors import ConfigError


def test_auto_gives_the_serving_hosts_the_last_half_and_the_job_the_rest() -> None:
    assert core_split("auto", {0, 1}) == CoreSplit(serving=(1,), job=(0,))
    assert core_split("auto", {0, 1, 2, 3, 4}) == CoreSplit(serving=(2, 3, 4), job=(0, 1))
    assert core_split("auto", {3}) is None  # one core: nothing to split
    assert core_split("none", {0, 1, 2, 3}) is None
    split = core_split("2-3", {0, 1, 2, 3})
    assert split == CoreSplit(serving=(2, 3), job=(0, 1))
    assert split.env_of("serving") == {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}
    assert split.env_of("dedicated") == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}


def test_a_split_that_cannot_work_is_refused_with_its_fix() -> None:
    with pytest.raises(ConfigError, match="leaves the job no core"):
        core_split("0-1", {0, 1})
    with pytest.raises(ConfigError, match=r"may not use \(7; it may use 0,1\)"):
        core_split("7", {0, 1})
    with pytest.raises(msgspec.ValidationError, match=r"CPU list such as .* at `\$.executors`"):
        msgspec.convert({"executors": {"serving_cores": "two"}}, RunConfig)


def test_cpu_lists_read_and_write_as_linux_does() -> None:
    assert parse_cpu_list("0, 2-4,9") == (0, 2, 3, 4, 9)
    assert cpu_list((0, 2, 3)) == "0,2,3"
    for bad in ("", "a", "-1", "3-", ","):
        with pytest.raises(ValueError, match="CPU list"):
            parse_cpu_list(bad)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin a child to one of them")
def test_a_child_starts_pinned_to_its_cores(tmp_path) -> None:
    core = max(os.sched_getaffinity(0))
    children = ChildProcesses(tmp_path)
    child = children.start("pinned", [sys.executable, "-c", "import os, sys, time; time.sleep(0.5); "
                                      "print(sorted(os.sched_getaffinity(0)), os.environ['X'])"],
                           env={"X": "y"}, cores=(core,))
    assert child.proc.wait(timeout=30) == 0
    children.stop_all()
    assert child.log_path.read_text().strip() == f"[{core}] y"
    assert os.sched_getaffinity(0) != {core}  # the parent is untouched
