"""The job's model directories: the user's own (``[model] policy / serving``, checked) or the generated tiny
demo models (``rose_core.app.rl.demo.models.ensure_models``) for whichever is left empty.

A directory is what ``model.save_pretrained(DIR)`` and ``tokenizer.save_pretrained(DIR)`` write: config.json,
``*.safetensors`` weights and a tokenizer. The policy's tokenizer must be a fast one (``tokenizer.json``):
the RL job tokenizes observations with it, and its size may not exceed the model's ``vocab_size``. The
built-in FrozenLake job sends raw token prompts, so the policy needs no chat template; the serving endpoint
(OpenAI chat API) and chat-shaped environments do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rose_core.app.config import RunConfig
from rose_core.app.rl.demo.models import ModelPaths, ensure_models, load_tokenizer
from rose_core.support.errors import ConfigError, RoseError

SAVE_HINT = "save it with model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def resolve_models(config: RunConfig) -> ModelPaths:
    """The policy and serving directories of the job: ``config.model``'s, checked (one ``ConfigError`` line
    naming the field, the path, what is missing and the fix), else the generated ones under ``models_dir``."""
    chosen = config.model
    policy = check_policy_dir(Path(chosen.policy)) if chosen.policy else None
    serving = check_model_dir("model.serving", Path(chosen.serving)) if chosen.serving else None
    if policy is None or serving is None:
        generated = ensure_models(Path(config.models_dir))
        policy, serving = policy or generated.policy, serving or generated.serving
    return ModelPaths(policy=policy, serving=serving)


def check_policy_dir(path: Path) -> Path:
    """``path`` (absolute) when it holds a trainable policy: a model directory with a fast tokenizer whose
    size fits the model's vocabulary."""
    directory = check_model_dir("model.policy", path)
    if not (directory / "tokenizer.json").is_file():
        raise ConfigError(
            f"`model.policy` = {str(path)!r} has no tokenizer.json (the RL job needs a fast tokenizer): "
            "save it with AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(DIR)"
        )
    vocab_size = _vocab_size(directory)
    try:
        tokens = load_tokenizer(directory).vocab_size
    except RoseError as exc:
        raise ConfigError(f"`model.policy` = {str(path)!r}: {exc}") from exc
    if tokens > vocab_size:
        raise ConfigError(
            f"`model.policy` = {str(path)!r}: its tokenizer has {tokens} tokens but the model's vocab_size is "
            f"{vocab_size}: resize the embeddings (model.resize_token_embeddings({tokens})) and save it again"
        )
    return directory


def check_model_dir(field: str, path: Path) -> Path:
    """``path`` made absolute when it is a Hugging Face model directory (config.json, safetensors weights, a
    tokenizer); else one ``ConfigError`` line naming ``field``, the path, what is missing and the fix."""
    directory = path.expanduser().resolve()
    where = f"`{field}` = {str(path)!r}"
    if not directory.is_dir():
        raise ConfigError(f"{where} is not a directory: fix the path, or leave it empty for the generated model")
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{where} has no config.json: {SAVE_HINT}")
    if not any(directory.glob("*.safetensors")):
        raise ConfigError(
            f"{where} has no *.safetensors weights (the trainer and vLLM load safetensors): {SAVE_HINT} "
            "(safetensors is its default)"
        )
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{where} has no tokenizer (tokenizer.json or tokenizer_config.json): {SAVE_HINT}")
    return directory


def _vocab_size(directory: Path) -> int:
    """``vocab_size`` of the model's config.json (or of its ``text_config``)."""
    file = directory / "config.json"
    try:
        settings: dict[str, Any] = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file} ({exc}): {SAVE_HINT}") from exc
    value = settings.get("vocab_size", settings.get("text_config", {}).get("vocab_size"))
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{file} has no positive vocab_size: {SAVE_HINT}")
    return value
