"""`rose run` on your own models: a Qwen2-shaped policy (tied embeddings) and a Llama-shaped serving model, both
tiny, random and saved with transformers' `save_pretrained` into local directories (with the demo's tokenizer,
nothing downloaded), named in `[model]`. Real vLLM CPU engines load them, the real trainer trains the policy,
and every weight version reaches both executors bit-exact."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rose_core.app.rl.demo.models import ensure_models, load_tokenizer

from .rose_run_support import run_report as rose_run

STEPS = 2
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 1024}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[model]
policy = "{policy}"
serving = "{serving}"

[executors.serving_overrides]
max_model_len = 1024

[executors.dedicated_overrides]
max_model_len = 1024
"""


def save_model(directory: Path, architecture: str, demo: Path) -> Path:
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


@pytest.fixture(scope="module")
def run_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("rose-run-own-models")
    demo = ensure_models(work / "models").policy
    policy = save_model(work / "qwen2-policy", "qwen2", demo)
    serving = save_model(work / "llama-serving", "llama", demo)
    return rose_run(work, CONFIG.format(work=work, policy=policy, serving=serving), STEPS)


def test_the_run_trains_your_policy_and_every_executor_holds_its_weights(run_report: dict) -> None:
    assert run_report["ok"], f"{run_report['error']}\n{run_report['_stderr'][-3000:]}\n{run_report['_logs']}"
    assert "qwen2-policy" in run_report["_stdout"] and "llama-serving" in run_report["_stdout"]
    assert [s["published_version"] for s in run_report["steps"]] == [1, 2]
    assert run_report["weight_digest_mismatches"] == 0  # the engines hold exactly the trainer's weights
    assert all(e["weight_version"] == STEPS for e in run_report["executors"])
    assert run_report["serving_failed_requests"] == 0 and run_report["serving_requests"] > 0
