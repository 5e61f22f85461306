"""`rose run --env gateway`: a multi-turn agent written only against the official `openai` client plays
FrozenLake through the rollout gateway (one session per episode, the environment's observations as user
messages, its return as the session's reward). Its turns are routed by the elastic scheduler onto both pools,
come back with `token_ids` and logprobs, a GRPO step trains on the sessions, and the next sessions run on the
version it published. Real vLLM CPU engines, real sockets, the real client."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rose_core.config import RLConfig
from rose_core.rl.environments import load_environment

from .rose_run_support import LiveRun

GROUP_SIZE = 4
GROUPS_PER_STEP = 2
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[rl]
env = "gateway"
group_size = {group_size}
prompts_per_step = {groups}
max_tokens_per_turn = 24
algorithm = "grpo"
eval_every = 0

[load]
base_rps = 1.0
burst_rps = 1.5
"""


def play(base_url: str, key: str, seed: int, calls: list[dict[str, Any]]) -> float:
    """One FrozenLake episode through the gateway with the official client; the reward it sent."""
    env = load_environment("frozenlake")(seed, RLConfig())
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300)
    messages: list[dict[str, Any]] = [{"role": "user", "content": env.reset()}]
    total = 0.0
    while not env.done:
        reply = client.chat.completions.create(model="policy", messages=messages, logprobs=True, temperature=1.0)
        choice = reply.choices[0]
        extra = reply.model_extra or {}
        calls.append({"version": extra["rose_weight_version"], "pool": extra["rose_pool"],
                      "token_ids": (choice.model_extra or {})["token_ids"],
                      "logprobs": [t.logprob for t in choice.logprobs.content] if choice.logprobs else None})
        outcome = env.step(choice.message.content or "")
        total += outcome.reward
        messages += [{"role": "assistant", "content": choice.message.content or ""}]
        if not outcome.done:
            messages.append({"role": "user", "content": outcome.observation})
    return total


def open_session(gateway: str, key: str, group: str) -> dict[str, Any]:
    resp = httpx.post(f"{gateway}/sessions", json={"group": group}, headers={"Authorization": f"Bearer {key}"})
    resp.raise_for_status()
    return resp.json()


def play_round(gateway: str, key: str, tag: str) -> list[dict[str, Any]]:
    """``GROUPS_PER_STEP`` groups of ``GROUP_SIZE`` sessions, all at once (one thread per session)."""
    calls: list[dict[str, Any]] = []
    lock = threading.Lock()

    def session(index: int) -> None:
        group, member = divmod(index, GROUP_SIZE)
        opened = open_session(gateway, key, f"{tag}-g{group}")
        mine: list[dict[str, Any]] = []
        reward = play(opened["base_url"], key, seed=1000 * group + 7, calls=mine)
        resp = httpx.post(f"{gateway}/sessions/{opened['session_id']}/reward", json={"reward": reward},
                          headers={"Authorization": f"Bearer {key}"})
        resp.raise_for_status()
        with lock:
            calls.extend(mine)

    with ThreadPoolExecutor(GROUP_SIZE * GROUPS_PER_STEP) as pool:
        list(pool.map(session, range(GROUP_SIZE * GROUPS_PER_STEP)))
    return calls


@pytest.fixture(scope="module")
def gateway_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work: Path = tmp_path_factory.mktemp("rose-run-gateway")
    config = CONFIG.format(work=work, group_size=GROUP_SIZE, groups=GROUPS_PER_STEP)
    with LiveRun(work, config, 2) as run:
        found = run.wait_for_line(r"gateway (http://\S+) key-file (\S+)")
        gateway, key = found.group(1), Path(found.group(2)).read_text().strip()
        first = play_round(gateway, key, "a")
        second = play_round(gateway, key, "b")
        report = run.finish()
    return {"report": report, "first": first, "second": second}


def test_the_run_trains_on_the_sessions(gateway_run: dict[str, Any]) -> None:
    report = gateway_run["report"]
    assert report["ok"], f"{report['error']}\n{report['_stderr'][-3000:]}\n{report['_logs']}"
    first = report["steps"][0]
    assert first["trajectories"] == GROUP_SIZE * GROUPS_PER_STEP and first["lost_trajectories"] == 0
    assert first["train"]["samples"] == len(gateway_run["first"])  # one sample per call
    assert first["published_version"] == 1 and report["version_mismatches"] == 0


def test_calls_return_token_ids_and_logprobs(gateway_run: dict[str, Any]) -> None:
    for call in gateway_run["first"] + gateway_run["second"]:
        assert call["token_ids"] and len(call["logprobs"]) == len(call["token_ids"])
        assert all(lp <= 0.0 for lp in call["logprobs"])


def test_turns_land_on_both_pools(gateway_run: dict[str, Any]) -> None:
    pools = {c["pool"] for c in gateway_run["first"] + gateway_run["second"]}
    assert pools == {"dedicated", "serving"}, pools
    steps = gateway_run["report"]["steps"]
    assert sum(s["turns_serving"] for s in steps) >= 1 and sum(s["turns_dedicated"] for s in steps) >= 1


def test_the_next_sessions_run_on_the_next_version(gateway_run: dict[str, Any]) -> None:
    assert {c["version"] for c in gateway_run["first"]} == {0}
    assert {c["version"] for c in gateway_run["second"]} == {1}
