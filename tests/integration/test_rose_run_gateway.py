"""`rose run --env gateway`: first an OpenAI Agents SDK agent (`openai-agents`, from the package index) with a
`function_tool` `add(a, b)` answers a sum through the rollout gateway, the policy a Qwen-templated tiny model
warm-started to call the tool (`tests/tool_policy.py`), its replies parsed by vLLM's `hermes` parser (the tool
call in `tool_calls`, streamed as deltas to half the agents, the tool's result sent back as a `tool` message
and held as prompt in the session's one sequence), and a GRPO step trains on those sessions. Then a
multi-turn agent written only against the official `openai` client plays
FrozenLake through the rollout gateway (one session per episode, the environment's observations as user
messages, its return as the session's reward). Its turns are routed by the elastic scheduler onto both pools,
come back with `token_ids` and logprobs, a GRPO step trains on the sessions, and the next sessions run on the
version it published. Then the same agent written with the OpenAI Agents SDK (`openai-agents`, from the
package index, speaking chat completions) plays the next two steps. Real vLLM CPU engines, real sockets,
the real clients."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rose_core.app.config import RLConfig
from rose_core.app.rl.demo.models import load_tokenizer
from rose_core.app.rl.environments.registry import load_environment
from tool_policy import ARGUMENTS, QUESTION, answer_text, build_tool_policy, sampled_runs

from .rose_run_support import LiveRun

GROUP_SIZE = 4
GROUPS_PER_STEP = 2
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[model]
policy = "{policy}"

[gateway]
tool_parser = "hermes"

[rl]
env = "gateway"
group_size = {group_size}
prompts_per_step = {groups}
max_tokens_per_turn = 32
max_context_tokens = 1024
algorithm = "grpo"
eval.every = 0

[slo]
# the serving guard keeps these fixed budgets (2 s TTFT, 400 ms TPOT), not an SLO measured on serving alone:
# this run is about the gateway routing onto both pools, and on a loaded 2-core host a tight budget has left
# the borrowed executor without headroom for all four steps (every turn on the dedicated one)
from_alone = 0

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
        reply = client.chat.completions.create(model="policy", messages=messages, logprobs=True, top_logprobs=2,
                                               temperature=1.0)
        choice = reply.choices[0]
        extra = reply.model_extra or {}
        calls.append({"version": extra["rose_weight_version"], "pool": extra["rose_pool"],
                      "token_ids": (choice.model_extra or {})["token_ids"],
                      "logprobs": [t.logprob for t in choice.logprobs.content] if choice.logprobs else None,
                      "top_logprobs": [[a.logprob for a in t.top_logprobs] for t in choice.logprobs.content]
                      if choice.logprobs else None})
        outcome = env.step(choice.message.content or "")
        total += outcome.reward
        messages += [{"role": "assistant", "content": choice.message.content or ""}]
        if not outcome.done:
            messages.append({"role": "user", "content": outcome.observation})
    return total


def play_with_agents_sdk(base_url: str, key: str, seed: int, calls: list[dict[str, Any]]) -> float:
    """The same episode as an OpenAI Agents SDK agent (one ``Runner.run`` per environment step, its input list
    carried over); the gateway's extra fields are read from the raw responses of its client."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)  # nothing leaves the machine
    env = load_environment("frozenlake")(seed, RLConfig())

    async def record(response: httpx.Response) -> None:
        if response.url.path.endswith("/chat/completions"):
            body = json.loads(await response.aread())
            calls.append({"version": body["rose_weight_version"], "pool": body["rose_pool"],
                          "token_ids": body["choices"][0]["token_ids"], "logprobs": None})

    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300,
                                http_client=httpx.AsyncClient(event_hooks={"response": [record]}, timeout=300))
    agent = Agent(name="lake-walker", instructions="Answer with one move: left, right, up or down.",
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                  model_settings=ModelSettings(temperature=1.0))

    async def episode() -> float:
        items: list[Any] = [{"role": "user", "content": env.reset()}]
        total = 0.0
        while not env.done:
            result = await Runner.run(agent, items, max_turns=1)
            outcome = env.step(str(result.final_output or ""))
            total += outcome.reward
            items = [*result.to_input_list(), {"role": "user", "content": outcome.observation}]
        return total

    return asyncio.run(episode())


def call_add_with_agents_sdk(base_url: str, key: str, seed: int, calls: list[dict[str, Any]]) -> float:
    """An Agents SDK agent with the tool ``add`` asked ``QUESTION`` (streamed for odd seeds): reward 1 when the
    tool ran once with the question's numbers and the agent's answer is its result in words."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    ran: list[tuple[int, int]] = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.append((a, b))
        return a + b

    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300)
    agent = Agent(name="adder", instructions="You add numbers.", tools=[add],
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                  model_settings=ModelSettings(temperature=0.0))

    async def run() -> str:
        if seed % 2 == 0:
            return str((await Runner.run(agent, QUESTION, max_turns=3)).final_output)
        streamed = Runner.run_streamed(agent, QUESTION, max_turns=3)
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)

    answer = asyncio.run(run())
    calls.append({"ran": list(ran), "answer": answer, "streamed": seed % 2 == 1})
    return 1.0 if ran == [tuple(ARGUMENTS.values())] and answer == answer_text() else 0.0


def open_session(gateway: str, key: str, group: str) -> dict[str, Any]:
    resp = httpx.post(f"{gateway}/sessions", json={"group": group}, headers={"Authorization": f"Bearer {key}"})
    resp.raise_for_status()
    return resp.json()


Agent = Callable[[str, str, int, list[dict[str, Any]]], float]


def play_round(gateway: str, key: str, tag: str, agent: Agent = play) -> list[dict[str, Any]]:
    """``GROUPS_PER_STEP`` groups of ``GROUP_SIZE`` sessions, all at once (one thread per session)."""
    calls: list[dict[str, Any]] = []
    lock = threading.Lock()

    def session(index: int) -> None:
        group = index // GROUP_SIZE
        opened = open_session(gateway, key, f"{tag}-g{group}")
        mine: list[dict[str, Any]] = []
        reward = agent(opened["base_url"], key, 1000 * group + 7 + index, mine)
        headers = {"Authorization": f"Bearer {key}"}
        # the history before the reward: a complete group leaves the table when the step takes it
        history = httpx.get(f"{gateway}/sessions/{opened['session_id']}", headers=headers).json()
        resp = httpx.post(f"{gateway}/sessions/{opened['session_id']}/reward", json={"reward": reward}, headers=headers)
        resp.raise_for_status()
        with lock:
            calls.extend({**call, "session": history} for call in mine)

    with ThreadPoolExecutor(GROUP_SIZE * GROUPS_PER_STEP) as pool:
        list(pool.map(session, range(GROUP_SIZE * GROUPS_PER_STEP)))
    return calls


@pytest.fixture(scope="module")
def gateway_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work: Path = tmp_path_factory.mktemp("rose-run-gateway")
    policy = build_tool_policy(work / "tool-policy")
    config = CONFIG.format(work=work, policy=policy, group_size=GROUP_SIZE, groups=GROUPS_PER_STEP)
    with LiveRun(work, config, 5) as run:
        found = run.wait_for_line(r"gateway (http://\S+) key-file (\S+)")
        gateway, key = found.group(1), Path(found.group(2)).read_text().strip()
        tools = play_round(gateway, key, "t", call_add_with_agents_sdk)
        rounds = [play_round(gateway, key, "a"), play_round(gateway, key, "b")]
        rounds += [play_round(gateway, key, tag, play_with_agents_sdk) for tag in ("c", "d")]
        report = run.finish()
    return {"report": report, "tools": tools, "policy": policy, "first": rounds[0], "second": rounds[1],
            "sdk": rounds[2:]}


def test_an_agents_sdk_agent_calls_its_tool_and_the_step_trains_on_it(gateway_run: dict[str, Any]) -> None:
    """Every agent's tool ran once with (2, 3) and its answer is the tool's result: the call came back in
    ``tool_calls`` (to the streamed agents as deltas, which the SDK put back together), the result went back as
    a ``tool`` message. Each session is one sequence: the call and the answer sampled (mask 1), the tool's result
    between them prompt (mask 0). The first step trained on the two calls of each."""
    tools = gateway_run["tools"]
    assert len(tools) == GROUP_SIZE * GROUPS_PER_STEP and {t["streamed"] for t in tools} == {False, True}
    assert all(t["ran"] == [(2, 3)] and t["answer"] == answer_text() for t in tools), tools
    codec = load_tokenizer(gateway_run["policy"])
    for tool in tools:
        (segment,) = tool["session"]["segments"]
        (_, call_end), (answer_start, _) = sampled_runs(segment["mask"])
        assert "<tool_response>\n5\n</tool_response>" in codec.decode(segment["tokens"][call_end:answer_start])
        assert tool["session"]["weight_versions"] == [0, 0]
    first = gateway_run["report"]["steps"][0]
    assert first["trajectories"] == GROUP_SIZE * GROUPS_PER_STEP and first["train"]["samples"] == 2 * len(tools)
    assert first["published_version"] == 1


def test_the_run_trains_on_the_sessions(gateway_run: dict[str, Any]) -> None:
    report = gateway_run["report"]
    assert report["ok"], f"{report['error']}\n{report['_stderr'][-3000:]}\n{report['_logs']}"
    first = report["steps"][1]
    assert first["trajectories"] == GROUP_SIZE * GROUPS_PER_STEP and first["lost_trajectories"] == 0
    assert first["train"]["samples"] == len(gateway_run["first"])  # one sample per call
    assert first["published_version"] == 2 and report["version_mismatches"] == 0


def test_calls_return_token_ids_and_logprobs(gateway_run: dict[str, Any]) -> None:
    """Each call asked for two alternatives per token (``top_logprobs = 2``): vLLM's, likeliest first, from the
    executor that ran the turn (either pool)."""
    for call in gateway_run["first"] + gateway_run["second"]:
        assert call["token_ids"] and len(call["logprobs"]) == len(call["token_ids"])
        assert all(lp <= 0.0 for lp in call["logprobs"])
        assert len(call["top_logprobs"]) == len(call["token_ids"])
        assert all(len(top) == 2 and top[0] >= top[1] and top[0] >= lp - 1e-5
                   for top, lp in zip(call["top_logprobs"], call["logprobs"], strict=True))


def test_turns_land_on_both_pools(gateway_run: dict[str, Any]) -> None:
    """Over the run's four steps: which pool a call lands on depends on the borrowed serving executor's SLO
    headroom at that moment (with the profile-derived budget, a clean-clone CI run once saw every call of the
    first two steps on the dedicated executor, and another every call of all four: hence fixed budgets of
    2 s / 400 ms in this run's config)."""
    calls = gateway_run["first"] + gateway_run["second"] + [c for r in gateway_run["sdk"] for c in r]
    pools = {c["pool"] for c in calls}
    assert pools == {"dedicated", "serving"}, pools
    steps = gateway_run["report"]["steps"]
    assert sum(s["turns_serving"] for s in steps) >= 1 and sum(s["turns_dedicated"] for s in steps) >= 1


def test_the_next_sessions_run_on_the_next_version(gateway_run: dict[str, Any]) -> None:
    assert {c["version"] for c in gateway_run["first"]} == {1}
    assert {c["version"] for c in gateway_run["second"]} == {2}


def test_an_agents_sdk_agent_does_the_same(gateway_run: dict[str, Any]) -> None:
    third, fourth = gateway_run["sdk"]
    steps = gateway_run["report"]["steps"]
    assert [s["trajectories"] for s in steps[3:]] == [GROUP_SIZE * GROUPS_PER_STEP] * 2
    assert [s["train"]["samples"] for s in steps[3:]] == [len(third), len(fourth)]
    assert {c["version"] for c in third} == {3} and {c["version"] for c in fourth} == {4}
    assert all(c["token_ids"] for c in third + fourth)
    assert {c["pool"] for c in third + fourth} <= {"dedicated", "serving"}  # both, over the run: the test above
