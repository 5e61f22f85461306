"""Issue 31's run: one standing serving host keeps production load (the official `openai` client, 2.5 requests/s)
across three RL jobs that attach to it one after the other, and nothing on the RL side stops or slows
production. Real processes, real vLLM CPU engines, real sockets, real signals; `rose-executor` started as an
operator starts it, `rose controller` per job.

- The host serves your own model (a tiny Llama-shaped one saved with `save_pretrained`) and, between leases,
  nothing else.
- Job A (the demo's policy) attaches, runs its steps and ends: a release, not a shutdown.
- Job B (the demo's policy from another directory): one of its weight applies fails (the rollout engine's
  processes run out of file descriptors, so its pull cannot connect: a real fault, no hook), the host drops that
  rollout engine and B takes the host back with a new one; then the rollout engine's process is SIGKILLed (the
  host ends the lease, B takes it back again); then B's controller is SIGKILLed and the lease expires.
- Job C (your own Qwen2-shaped policy, tied embeddings) attaches, its rollout engine is SIGSTOPped for 10 s (a
  call into it that comes due meanwhile times out after `call_timeout_s` and ends the lease, C taking the host
  back; else the lease holds and its turns wait), C goes on on the host, then the operator revokes the host
  (`rose-executor revoke`); C finishes on a dedicated executor started after the revocation.

Every time the host comes back to a running job it is sent the job's newest version as it registers (decision
322). The fixture prints production's p99 TTFT per phase beside serving alone's.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from rose_core.app.config import load_config
from rose_core.app.rl.demo.models import ensure_models, load_tokenizer
from rose_core.app.run.executor_files import executor_config, with_overrides, write_executor_config
from rose_core.config.slo import JobSlo
from rose_core.protocol.auth import write_new_secret
from rose_core.support.metrics import free_port

from .rose_run_support import LiveRun, metric

JOB = """
models_dir = "{work}/models"
run_dir = "{work}/run-{name}"

[model]
policy = "{policy}"
serving = "{serving}"

[controller]
port = {port}

[executors]
dedicated = 0
serving = 1

[executors.serving_overrides]
max_model_len = 1024

[executors.dedicated_overrides]
max_model_len = 1024

[rl]
max_tokens_per_turn = 24
eval.every = 0
"""
A_STEPS, C_STEPS = 2, 12
"""C runs on the host alone until the revocation (about five steps: its lease is down while its rollout engine
is stopped and restarted), then on the dedicated executor started after it, until it is stopped cleanly
(SIGUSR1) two steps later."""
HOST = {"lease_expiry_s": 5.0, "lend_retry_s": 0.5, "rollout": {"call_timeout_s": 5.0}}
"""The host's settings for a short run: a gone controller's lease ends after 5 s, a hung call after 5 s."""
RATE_S = 0.4
"""One production request every 0.4 s: 2.5 requests/s."""
ALONE_S = 8.0
"""Production served alone before the first job: 20 requests, the sample its SLO is measured on."""
STEADY = ("steady A", "steady B", "steady B after the failed apply", "steady B after the kill", "steady C")
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 1024}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def save_model(directory: Path, architecture: str, demo: Path) -> Path:
    """A tiny random model of ``architecture`` saved as a user saves theirs, with the demo's tokenizer."""
    import torch
    import transformers

    codec = load_tokenizer(demo)
    config_class, model_class = {
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[architecture]
    config = config_class(vocab_size=codec.vocab_size, tie_word_embeddings=architecture == "qwen2",
                          bos_token_id=codec.bos_id, eos_token_id=codec.eos_id, pad_token_id=codec.pad_id, **TINY)
    torch.manual_seed(0)
    model_class(config).to(torch.bfloat16).save_pretrained(str(directory))
    for name in TOKENIZER_FILES:
        if (demo / name).is_file():
            shutil.copyfile(demo / name, directory / name)
    return directory


@dataclass
class ProductionLoad:
    """Streaming completions on the host's endpoint at a fixed rate, each in its own thread; TTFT per request."""

    base_url: str
    sent: list[tuple[float, float | None, str]] = field(default_factory=list)
    """(sent at, TTFT or None, error) per request."""
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> ProductionLoad:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        with ThreadPoolExecutor(16) as pool:
            while not self._stop.wait(RATE_S):
                pool.submit(self._one, client, model, time.monotonic())

    def _one(self, client: openai.OpenAI, model: str, at: float) -> None:
        try:
            stream = client.completions.create(model=model, prompt=[5, 6, 7, 8], max_tokens=8, stream=True)
            first = None
            for _ in stream:
                first = first if first is not None else time.monotonic() - at
            self.sent.append((at, first, ""))
        except Exception as exc:
            self.sent.append((at, None, repr(exc)))


@dataclass
class Phases:
    marks: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, name: str) -> None:
        self.marks.append((name, time.monotonic()))

    def p99_ttft(self, load: ProductionLoad) -> dict[str, tuple[int, float]]:
        """Per phase: requests sent in it, and their p99 TTFT in ms."""
        out: dict[str, tuple[int, float]] = {}
        for (name, start), (_, end) in zip(self.marks, [*self.marks[1:], ("", float("inf"))], strict=True):
            ttfts = sorted(t for at, t, _ in load.sent if start <= at < end and t is not None)
            if ttfts:
                out[name] = (len(ttfts), 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))])
        return out


def lease_gauges(url: str) -> tuple[float, float, float]:
    """Whether the host holds a lease, its rollout engine's bytes, serving's budget (the host's metrics)."""
    return (metric(url, "rose_executor_lease_active"), metric(url, "rose_executor_rollout_engine_bytes"),
            metric(url, "rose_executor_serving_budget_bytes"))


def until(what: str, predicate: Any, timeout_s: float) -> None:
    """Poll ``predicate`` (an OSError reading a process's endpoint is polled again) until true, or fail."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.1)


def engine_cores(host: int) -> set[int]:
    """The vLLM engine-core processes under the host (production's, and the rollout engine's while it runs)."""
    found = set()
    for proc in psutil.Process(host).children(recursive=True):
        try:
            if proc.name().startswith("VLLM::EngineCore") and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except psutil.Error:
            pass
    return found


def with_children(pids: set[int]) -> list[psutil.Process]:
    """The processes ``pids`` and everything under them (a vLLM engine core and its workers)."""
    procs = [psutil.Process(pid) for pid in pids]
    return [*procs, *(child for proc in procs for child in proc.children(recursive=True))]


def key_for(work: Path, secret: Path, executor_id: str) -> Path:
    key = work / f"{executor_id}.key"
    subprocess.run([sys.executable, "-m", "rose_core", "executor-key", executor_id, "--secret-file", str(secret),
                    "--out", str(key)], check=True, capture_output=True)
    return key


def start_executor(work: Path, secret: Path, port: int, role: str, config: Path, *more: str) -> subprocess.Popen[bytes]:
    """`rose-executor` as an operator starts it: its own key, its own config, no parent to die with."""
    executor_id = f"{role}-0"
    return subprocess.Popen([sys.executable, "-m", "rose_executor", "--controller", f"tcp://127.0.0.1:{port}",
                             "--role", role, "--config", str(config), "--executor-id", executor_id,
                             "--secret-file", str(key_for(work, secret, executor_id)), *more],
                            stdout=(work / f"{executor_id}.log").open("wb"), stderr=subprocess.STDOUT)


def answers(base_url: str) -> bool:
    try:
        openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30).models.list()
    except openai.OpenAIError:
        return False
    return True


def host_log(work: Path) -> str:
    return (work / "serving-0.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def standing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("standing-host")
    secret = work / "secret"
    write_new_secret(secret)
    demo = ensure_models(work / "models")
    shutil.copytree(work / "models", work / "models-b")
    own_policy = save_model(work / "qwen2-policy", "qwen2", demo.policy)
    own_serving = save_model(work / "llama-serving", "llama", demo.policy)
    port = free_port()
    policies = {"a": demo.policy, "b": work / "models-b" / demo.policy.name, "c": own_policy}
    job_text = {name: JOB.format(work=work, name=name, port=port, policy=policy, serving=own_serving)
                for name, policy in policies.items()}
    (work / "job-a.toml").write_text(job_text["a"])
    serving_port, metrics_port = free_port(), free_port()
    section = executor_config(load_config(work / "job-a.toml"), "serving", demo.policy, own_serving)
    write_executor_config(work / "host.toml", with_overrides(section, {**HOST, "serving": {"port": serving_port}}, "test"))
    host = start_executor(work, secret, port, "serving", work / "host.toml", "--metrics-port", str(metrics_port))
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    phases, gauges, reports, out = Phases(), {}, {}, {}
    load = ProductionLoad(f"http://127.0.0.1:{serving_port}/v1")
    controller = ("--secret-file", str(secret))
    dedicated: subprocess.Popen[bytes] | None = None
    try:
        until("production up", lambda: answers(load.base_url), 600)
        production = engine_cores(host.pid)
        load.start()
        phases.mark("serving alone")
        time.sleep(ALONE_S)
        gauges["before"] = lease_gauges(metrics_url)

        with LiveRun(work, job_text["a"], A_STEPS, command="controller", name="-a", args=controller) as a:
            phases.mark("attach A")
            until("A's lease", lambda: lease_gauges(metrics_url)[0] == 1, 300)
            phases.mark("steady A")
            reports["a"] = a.finish()
        phases.mark("detach A")
        until("A's lease over", lambda: lease_gauges(metrics_url)[0] == 0, 120)
        gauges["a"] = lease_gauges(metrics_url)
        phases.mark("alone after A")
        time.sleep(2)

        with LiveRun(work, job_text["b"], 200, command="controller", name="-b", args=controller) as b:
            phases.mark("attach B")
            b.wait_for_row(1)
            phases.mark("steady B")
            time.sleep(4)
            rollout = engine_cores(host.pid) - production
            assert rollout, "no rollout engine core beside production's"
            for proc in with_children(rollout):  # out of descriptors: the next version's pull cannot connect
                proc.rlimit(psutil.RLIMIT_NOFILE, (3, proc.rlimit(psutil.RLIMIT_NOFILE)[1]))
            phases.mark("weight apply fails (B)")
            until("B's failed apply", lambda: "not applied" in host_log(work), 120)
            until("B's next lease", lambda: engine_cores(host.pid) - production - rollout, 300)
            rollout = engine_cores(host.pid) - production
            until("B's next lease", lambda: lease_gauges(metrics_url)[0] == 1, 300)
            phases.mark("steady B after the failed apply")
            time.sleep(4)
            for pid in rollout:
                psutil.Process(pid).kill()
            phases.mark("rollout engine killed (B)")
            until("B's lease after the kill", lambda: engine_cores(host.pid) - production - rollout, 300)
            until("B's lease after the kill", lambda: lease_gauges(metrics_url)[0] == 1, 300)
            phases.mark("steady B after the kill")
            time.sleep(4)
            b.proc.send_signal(signal.SIGKILL)
            b.proc.wait()
            phases.mark("controller killed (B)")
            until("B's lease expired", lambda: lease_gauges(metrics_url)[0] == 0, 60)
            gauges["b"] = lease_gauges(metrics_url)
        phases.mark("alone after B")
        time.sleep(2)

        (work / "job-c.toml").write_text(job_text["c"])
        write_executor_config(work / "dedicated.toml", executor_config(load_config(work / "job-c.toml"), "dedicated",
                                                                       own_policy, own_policy))
        with LiveRun(work, job_text["c"], C_STEPS, command="controller", name="-c", args=controller) as c:
            phases.mark("attach C")
            c.wait_for_row(1)
            phases.mark("steady C")
            time.sleep(4)
            rollout = engine_cores(host.pid) - production
            stopped = with_children(rollout)
            for proc in stopped:
                proc.suspend()
            phases.mark("rollout engine stopped (C)")
            time.sleep(10)
            for proc in stopped:
                if proc.is_running():
                    proc.resume()
            phases.mark("rollout engine continued (C)")
            rows = c.rows_so_far()
            until("C's next step on the host", lambda: c.rows_so_far() > rows, 300)  # the host is all C has
            until("C's lease", lambda: lease_gauges(metrics_url)[0] == 1, 300)
            out["revoke"] = subprocess.run([sys.executable, "-m", "rose_executor", "revoke", "serving-0", "--json"],
                                           capture_output=True, text=True, timeout=60, check=False)
            phases.mark("revoked (C)")
            until("C's lease over", lambda: lease_gauges(metrics_url)[0] == 0, 120)
            gauges["c"] = lease_gauges(metrics_url)
            out["rows_at_revoke"] = c.rows_so_far()
            phases.mark("alone after C")
            dedicated = start_executor(work, secret, port, "dedicated", work / "dedicated.toml")
            until("C's steps on the dedicated executor", lambda: c.rows_so_far() > out["rows_at_revoke"] + 1, 300)
            if c.rows_so_far() < C_STEPS - 2:  # C goes on without the host: stop it cleanly after the step in flight
                c.proc.send_signal(signal.SIGUSR1)
            reports["c"] = c.finish()
        out["dedicated_code"] = dedicated.wait(120)  # C released it at its end: a job's own executor stops
        time.sleep(2)
        phases.mark("end")
        load.stop()
        time.sleep(2)
        out["production_after"] = engine_cores(host.pid) & production
        host.send_signal(signal.SIGTERM)  # only its operator stops it
        out["host_code"] = host.wait(120)
    finally:
        load.stop()
        for proc in (host, dedicated):
            if proc is not None and proc.poll() is None:
                proc.kill()
    return {**out, "load": load, "phases": phases, "gauges": gauges, "reports": reports, "production": production,
            "log": host_log(work)}


def test_no_production_request_failed_and_the_load_held(standing: dict[str, Any]) -> None:
    sent = standing["load"].sent
    failed = [error for _, _, error in sent if error]
    assert not failed, failed[:5]
    span = max(at for at, _, _ in sent) - min(at for at, _, _ in sent)
    assert len(sent) / span >= 2.0


def test_the_production_engine_is_the_one_it_started_with_and_only_its_operator_stopped_it(
        standing: dict[str, Any]) -> None:
    assert standing["production"] and standing["production_after"] == standing["production"]
    assert standing["host_code"] == 0
    assert "llama-serving" in standing["log"]  # your own serving model


def test_each_lease_end_leaves_pure_serving_with_its_whole_budget(standing: dict[str, Any]) -> None:
    gauges = standing["gauges"]
    for job in ("a", "b", "c"):
        active, rollout_bytes, serving_budget = gauges[job]
        assert (active, rollout_bytes) == (0, 0), (job, gauges[job])
        assert serving_budget == gauges["before"][2] > 0, (job, gauges)


def test_every_fault_of_job_b_cost_it_a_lease_not_the_host(standing: dict[str, Any]) -> None:
    log = standing["log"]
    assert "Too many open files" in log and "not applied" in log  # the failed apply
    assert log.count("models-b/policy ready in") == 3  # first lease, after the failed apply, after the kill
    # the kill is noticed by whichever call meets the dead engine first (a heartbeat, the guard, an update)
    assert "rollout engine died" in log


def test_the_finished_jobs_lost_nothing_and_ran_turns_on_the_host(standing: dict[str, Any]) -> None:
    for job, planned in (("a", A_STEPS), ("c", C_STEPS)):
        report = standing["reports"][job]
        steps = report["stopped_after_step"] or planned  # C is stopped (SIGUSR1) once it ran on without the host
        assert report["ok"], (job, report.get("error"))
        assert report["lost_trajectories"] == 0 and report["version_mismatches"] == 0, job
        assert report["weight_digest_mismatches"] == 0, job  # every engine held exactly the trainer's weights
        assert [s["published_version"] for s in report["steps"]] == list(range(1, steps + 1)), job
        assert sum(s["turns_serving"] for s in report["steps"]) > 0, job
    assert "qwen2-policy" in standing["reports"]["c"]["_stdout"]  # your own policy
    assert standing["rows_at_revoke"] < len(standing["reports"]["c"]["steps"]) and standing["dedicated_code"] == 0


def test_the_revocation_was_the_operators(standing: dict[str, Any]) -> None:
    assert standing["revoke"].returncode == 0, standing["revoke"].stderr
    assert standing["reports"]["c"]["left_executors"]["serving-0"].startswith("revoked")


def test_production_latency_per_phase_and_steady_lending_within_the_slo(standing: dict[str, Any]) -> None:
    """Production as its client sees it, judged the way the host sets its own SLO (`[slo] from_alone`): that
    multiple of the p99 TTFT the client saw while the host served alone, before any job. (The host's budget is
    of vLLM's own request timings, which start after the HTTP server has parsed the request: the client's TTFT
    is longer by the endpoint's own time, so it is judged against the client's own serving alone.)"""
    budget = re.search(r"SLO guard: TTFT budget ([\d.]+) ms", standing["log"])
    assert budget, "the host logged no SLO guard budget"
    multiple = JobSlo().from_alone
    table = standing["phases"].p99_ttft(standing["load"])
    count, alone_ms = table["serving alone"]
    assert count >= 15, table["serving alone"]
    slo_ms = multiple * alone_ms
    print(f"\nproduction p99 TTFT per phase as the client sees it (requests, ms; the SLO: {multiple:g} x serving "
          f"alone = {slo_ms:.1f} ms; the host's own, of vLLM's timings: {float(budget.group(1)):.1f} ms):")
    for name, (count, p99) in table.items():
        print(f"  {name:34s} {count:4d} {p99:8.1f}")
    for name in STEADY:
        assert table[name][1] <= slo_ms, (name, table[name])
