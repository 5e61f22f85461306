"""A gateway job survives its controller: agents play through the rollout gateway (the official `openai`
client, one session per episode, closed by its reward), and the controller is SIGKILLed in the middle of step
2's rollout, one group of sessions complete (journaled) and another session in the middle of its episode.
`rose controller --resume` restores the complete group from the journal, so step 2 needs one more group, not
two; the agent whose session was in flight gets the documented 404 (open a new session, play the episode
again) and does; the agents' key is the same. Nothing complete is lost and the job finishes. The executors
(processes of their own) kept serving production through the restart and joined the new controller by
themselves. Real processes, real vLLM CPU engines, real sockets."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rose_core.protocol.auth import write_new_secret
from rose_core.support.metrics import free_port

from .rose_run_support import LiveRun
from .standalone_fleet import served, start_executors

STEPS = 3
GROUP_SIZE = 2
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[controller]
port = {port}

[gateway]
port = {gateway_port}  # the agents find the restarted controller where they left it
step_timeout_s = 180  # a step 2 still missing its journaled group fails here, with the gateway's own message

[rl]
env = "gateway"
group_size = {group_size}
prompts_per_step = 2
max_tokens_per_turn = 8
checkpoint.every = 1
eval.every = 0
"""


class Agent:
    """An agent of the official client: sessions opened into groups, calls, a reward per session."""

    def __init__(self, gateway: str, key: str) -> None:
        self.gateway, self.key = gateway, key
        self.http = httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {key}"}, timeout=300)

    def open(self, group: str) -> str:
        resp = self.http.post("/sessions", json={"group": group})
        resp.raise_for_status()
        return str(resp.json()["session_id"])

    def call(self, session: str) -> None:
        client = openai.OpenAI(base_url=f"{self.gateway}/sessions/{session}/v1", api_key=self.key, max_retries=0,
                               timeout=300)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Walk to the goal."}],
                                       temperature=1.0)

    def reward(self, session: str, reward: float) -> None:
        self.http.post(f"/sessions/{session}/reward", json={"reward": reward}).raise_for_status()

    def play_group(self, group: str) -> None:
        """``GROUP_SIZE`` episodes of one call each, rewards 0 and 1 (a spread: the group trains)."""
        for index in range(GROUP_SIZE):
            session = self.open(group)
            self.call(session)
            self.reward(session, float(index % 2))


def journaled(checkpoints: Path) -> list[str]:
    journal = checkpoints / "gateway-groups"
    return sorted(p.name for p in journal.iterdir()) if journal.is_dir() else []


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("gateway-controller-restart")
    secret = work / "secret"
    write_new_secret(secret)
    config = CONFIG.format(work=work, port=free_port(), gateway_port=free_port(), group_size=GROUP_SIZE)
    args = ("--secret-file", str(secret))
    checkpoints = work / "run" / "checkpoints"
    executors: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    out: dict[str, Any] = {}
    try:
        with LiveRun(work, config, STEPS, args=args, command="controller", name="-first") as first:
            address = first.wait_for_line(r"rose-executor --controller (tcp://\S+)").group(1)
            executors = start_executors(work, address, secret)
            gateway, key_file = first.wait_for_line(r"gateway (http://\S+) key-file (\S+)").groups()
            key = Path(key_file).read_text().strip()
            agent = Agent(gateway, key)
            agent.play_group("one")
            agent.play_group("two")
            first.wait_for_row(1)  # step 1 trained on them and checkpointed
            agent.play_group("x")  # complete: step 2 takes it and waits for a second group
            first.until("group x journaled", lambda: len(journaled(checkpoints)) == 1, timeout_s=60)
            out["journaled"] = journaled(checkpoints)
            in_flight = agent.open("y")
            agent.call(in_flight)  # its episode goes on after the restart
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait()
        out["while_down"] = served(executors["serving"][1])
        with LiveRun(work, config, STEPS, args=(*args, "--resume", str(checkpoints)), command="controller",
                     name="-resumed") as resumed:
            found = resumed.wait_for_line(r"gateway (http://\S+) key-file (\S+)")
            out["same_gateway"] = found.groups() == (gateway, key_file)
            out["same_key"] = Path(found.group(2)).read_text().strip() == key
            with pytest.raises(openai.NotFoundError) as gone:
                agent.call(in_flight)
            out["answer"] = str(gone.value)
            agent.play_group("y")  # the episode again, in new sessions: step 2 has its two groups
            resumed.wait_for_row(2, timeout_s=300)
            out["journal_after_step_2"] = journaled(checkpoints)
            agent.play_group("three")
            agent.play_group("four")
            out["report"] = resumed.finish()
        out["journal_at_end"] = journaled(checkpoints)
        out["dedicated_code"] = executors["dedicated"][0].wait(timeout=120)  # released by the job's end
    finally:
        for proc, _ in executors.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
    out["logs"] = {role: (work / f"executor-{role}.log").read_text(errors="replace") for role in executors}
    return out


def test_the_resumed_job_trains_the_journaled_group_and_finishes(restarted: dict[str, Any]) -> None:
    """Step 2 completed with one group played after the restart: the other is group x, from the journal."""
    report = restarted["report"]
    assert report["ok"], f"{report['error']}\n{report['_stderr'][-4000:]}\n{restarted['logs']}"
    assert "resumed from" in report["_stdout"]
    assert "1 complete group(s) from before the restart are waiting to be trained" in report["_stderr"]
    assert [s["step"] for s in report["steps"]] == [2, 3]
    assert [s["trajectories"] for s in report["steps"]] == [2 * GROUP_SIZE] * 2
    assert [s["train"]["samples"] for s in report["steps"]] == [2 * GROUP_SIZE] * 2  # one call per session
    assert [s["published_version"] for s in report["steps"]] == [2, 3]
    assert report["lost_trajectories"] == 0 and report["version_mismatches"] == 0


def test_a_complete_group_stays_journaled_until_a_checkpoint_covers_it(restarted: dict[str, Any]) -> None:
    assert len(restarted["journaled"]) == 1
    assert restarted["journal_after_step_2"] == [] and restarted["journal_at_end"] == []


def test_the_session_in_flight_gets_the_documented_answer_and_the_key_holds(restarted: dict[str, Any]) -> None:
    assert "play the episode again" in restarted["answer"] and "controller restarted" in restarted["answer"]
    assert restarted["same_gateway"] and restarted["same_key"]


def test_production_was_served_through_the_restart(restarted: dict[str, Any]) -> None:
    assert restarted["while_down"] == 4
    assert restarted["dedicated_code"] == 0
    assert "restarted or lost this executor; joining it again" in restarted["logs"]["serving"]
