"""`rose run --ray` on a real local Ray cluster (2 CPUs, one unit of the serving resource declared): the
executors are Ray actors running real vLLM CPU engines, with no production traffic (nothing for the serving
executor's guard to hold turns back for: it runs turns in every step, which the kill below needs; a burst
once kept it idle for the 12 steps left of a run and failed the test). While the job runs, a second job asks for the same
serving resource and fails with an error that names it and the job holding it; then the first job's serving
actor is killed mid-step and the job finishes on the rest, nothing lost.

`nox -s ray` runs this (it installs rose-core[ray]); the module starts and stops its own Ray head node."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from integration.rose_run_support import LiveRun
from rose_core.support.metrics import free_port

STEPS = 20
SERVING_RESOURCE = "rose_serving_gpu"
ROW = re.compile(r"^\s*(\d+)\s+\d+\s+\d+\s+\d+/(\d+)\s")
"""A step's row in `rose run`'s table: the step, then (after version and trajectories) its serving turns."""
CONFIG = """
models_dir = "{models}"
run_dir = "{work}/run"

[rl]
max_tokens_per_turn = 24
eval.every = 0

[load]
enabled = false

[ray]
placement_timeout_s = {placement}

[executors]
dedicated = {dedicated}
serving = 1
"""


def _ray_cli(*args: str) -> subprocess.CompletedProcess[str]:
    ray_bin = Path(sys.executable).with_name("ray")
    return subprocess.run([str(ray_bin), *args], capture_output=True, text=True, timeout=180, check=False)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A Ray head on this machine, as an operator starts one: 2 CPUs, one serving GPU's worth of the custom
    resource (so one RL job at a time may hold it)."""
    address = f"127.0.0.1:{free_port()}"
    started = _ray_cli("start", "--head", f"--port={address.rsplit(':', 1)[1]}", "--num-cpus=2",
                       f"--resources={json.dumps({SERVING_RESOURCE: 1})}", "--include-dashboard=false",
                       "--disable-usage-stats")
    assert started.returncode == 0, started.stderr + started.stdout
    try:
        yield address
    finally:
        _ray_cli("stop", "--force")


def _after_serving_turns(run: LiveRun) -> int:
    """The next step (from now) whose row shows turns on the serving executor, with steps still to go after
    it; the serving executor must have run turns before it is killed."""
    for step in range(run.rows_so_far() + 1, STEPS - 1):
        run.wait_for_row(step)
        if any((m := ROW.match(line)) and int(m.group(1)) == step and int(m.group(2)) > 0 for line in run.stdout):
            return step
    raise AssertionError(f"the serving executor ran no turns by step {STEPS - 2}: {run.tail()}")


def _kill_actor(address: str, name: str) -> None:
    ray.init(address=address, namespace="rose", log_to_driver=False)
    try:
        ray.kill(ray.get_actor(name))
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def runs(cluster: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The first job runs; once its executors are up a second job asks for the serving GPU it holds (and gives
    up after 10 s); then, with steps still to go, the first job's serving actor is killed."""
    work = tmp_path_factory.mktemp("rose-run-ray")
    models = work / "models"
    (work / "first").mkdir()
    config = CONFIG.format(models=models, work=work / "first", placement=120, dedicated=1)
    with LiveRun(work / "first", config, STEPS, args=("--ray", cluster)) as first:
        first.wait_for_line(r"executors ready in")  # its actors hold their resources from here on
        actor = re.search(r"executor-serving-0: Ray actor (\S+) asks for", "".join(first.stderr_lines()))
        assert actor, first.tail()
        second_dir = work / "second"
        second_dir.mkdir()
        (second_dir / "rose.toml").write_text(CONFIG.format(models=models, work=second_dir, placement=10, dedicated=0))
        second = subprocess.run(
            [sys.executable, "-m", "rose_core", "run", "--steps", "1", "--config", str(second_dir / "rose.toml"),
             "--ray", cluster], capture_output=True, text=True, timeout=300, check=False)
        killed_in = _after_serving_turns(first) + 1
        _kill_actor(cluster, actor.group(1))  # during step killed_in
        report = first.finish()
    return {"first": report, "second": second, "actor": actor.group(1), "killed_in": killed_in}


def test_the_job_runs_on_ray_actors_and_both_pools_serve_turns(runs: dict) -> None:
    report = runs["first"]
    assert report["ok"], f"{report['error']}\n{report['_stderr'][-3000:]}\n{report['_logs']}"
    assert "starting 2 executors (Ray actors on 127.0.0.1:" in report["_stdout"]
    assert [s["step"] for s in report["steps"]] == list(range(1, STEPS + 1))
    assert [s["weight_version"] for s in report["steps"]] == list(range(STEPS))  # versions advance
    assert report["lost_trajectories"] == 0 and report["version_mismatches"] == 0
    assert sum(s["turns_dedicated"] for s in report["steps"]) > 0
    assert sum(s["turns_serving"] for s in report["steps"]) > 0


def test_a_second_job_cannot_take_the_serving_gpu_the_first_holds(runs: dict) -> None:
    second = runs["second"]
    assert second.returncode != 0, second.stdout
    job = runs["actor"].split("-")[1]  # the first job's id, in its actors' names
    message = second.stderr + second.stdout
    assert "executor-serving-0 waited 10 s for Ray resources (rose_serving_gpu: 1)" in message, message
    assert f"RL jobs holding rose_serving_gpu now: {job}" in message, message


def test_a_killed_executor_actor_is_an_executor_gone_and_the_job_finishes(runs: dict) -> None:
    report = runs["first"]
    assert list(report["retired_executors"]) == ["serving-0"], report["retired_executors"]
    assert "exited with code -9" in report["retired_executors"]["serving-0"]
    after = [s for s in report["steps"] if s["step"] > runs["killed_in"]]
    assert after and all(s["turns_serving"] == 0 for s in after)  # the rest of the job ran on dedicated-0
    assert report["lost_trajectories"] == 0


def test_an_address_where_no_ray_cluster_runs_is_one_clear_error(tmp_path: Path) -> None:
    """Ray's own connect would wait minutes for a head that is not there; `rose run` says so at once."""
    (tmp_path / "rose.toml").write_text(f'run_dir = "{tmp_path}/run"\nmodels_dir = "{tmp_path}/models"\n')
    address = f"127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "-m", "rose_core", "run", "--steps", "1", "--config",
                           str(tmp_path / "rose.toml"), "--ray", address],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert f"no Ray cluster answers at {address}" in done.stderr
    assert "ray start --head" in done.stderr
