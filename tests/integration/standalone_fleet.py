"""A fleet started as an operator starts one: `rose controller` (through ``LiveRun``) and its executors as
processes of their own (no --parent-pid), each with its own key from `rose executor-key`, so they outlive a
controller that is killed and join the next by themselves; and a production request on the serving host."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import msgspec

from rose_core.app.config import load_config
from rose_core.app.rl.demo.models import ensure_models
from rose_core.app.run.executor_files import executor_config, write_executor_config
from rose_core.support.metrics import free_port


def start_executors(work: Path, address: str, secret: Path) -> dict[str, tuple[subprocess.Popen[bytes], int]]:
    """The fleet: one dedicated and one serving executor, started as an operator would (no --parent-pid), each
    with its own key file from `rose executor-key`, not the secret."""
    config = load_config(work / "rose.toml")
    models = ensure_models(work / "models")
    out: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    for role in ("dedicated", "serving"):
        section = executor_config(config, role, models.policy, models.serving)
        port = free_port()
        if role == "serving":
            section = msgspec.structs.replace(section, serving=msgspec.structs.replace(section.serving, port=port))
        path = work / f"executor-{role}.toml"
        write_executor_config(path, section)
        log = (work / f"executor-{role}.log").open("wb")
        key = work / f"executor-{role}-0.key"
        subprocess.run([sys.executable, "-m", "rose_core", "executor-key", f"{role}-0", "--secret-file", str(secret),
                        "--out", str(key)], check=True, capture_output=True)
        argv = [sys.executable, "-m", "rose_executor", "--controller", address, "--role", role, "--config", str(path),
                "--executor-id", f"{role}-0", "--secret-file", str(key)]
        out[role] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), port)
    return out


def served(port: int) -> int:
    """One production request on the serving executor's OpenAI endpoint; the tokens it generated."""
    base = f"http://127.0.0.1:{port}/v1"
    with urllib.request.urlopen(f"{base}/models", timeout=60) as resp:
        model = json.loads(resp.read())["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": [5, 6, 7, 8], "max_tokens": 4, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"{base}/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])
