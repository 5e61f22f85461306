"""Your own models (``[model] policy / serving``): directories saved with transformers are checked, chosen over
the generated ones, trained by the reference trainer and exported under their own tensor names."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from rose_core.app.config import ModelConfig, RLConfig, RunConfig
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.demo.model_dirs import resolve_models
from rose_core.app.rl.demo.models import ModelPaths, iter_safetensors_names, load_tokenizer
from rose_core.app.rl.trainer.trainer import PolicyTrainer
from rose_core.support.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "max_position_embeddings": 128}


def _save(models: ModelPaths, directory: Path, architecture: str, *, tied: bool, vocab_size: int | None = None) -> Path:
    """A tiny random model of ``architecture`` saved with ``save_pretrained``, with the demo's tokenizer."""
    codec = load_tokenizer(models.policy)
    config_class = transformers.LlamaConfig if architecture == "llama" else transformers.Qwen2Config
    config = config_class(vocab_size=vocab_size or codec.vocab_size, tie_word_embeddings=tied,
                          bos_token_id=codec.bos_id, eos_token_id=codec.eos_id, pad_token_id=codec.pad_id, **TINY)
    model_class = transformers.LlamaForCausalLM if architecture == "llama" else transformers.Qwen2ForCausalLM
    torch.manual_seed(0)
    model_class(config).save_pretrained(str(directory))
    for name in TOKENIZER_FILES:
        shutil.copyfile(models.policy / name, directory / name)
    return directory


@pytest.fixture(scope="module")
def llama(models: ModelPaths, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(models, tmp_path_factory.mktemp("llama"), "llama", tied=False)


@pytest.fixture(scope="module")
def qwen2(models: ModelPaths, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(models, tmp_path_factory.mktemp("qwen2"), "qwen2", tied=True)


def _config(models: ModelPaths, policy: Path | str = "", serving: Path | str = "") -> RunConfig:
    return RunConfig(model=ModelConfig(policy=str(policy), serving=str(serving)), models_dir=str(models.policy.parent))


def _copy(source: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(source, tmp_path / "copy"))


def _samples(directory: Path) -> list[TrainSample]:
    codec = load_tokenizer(directory)
    assert codec.bos_id is not None
    prompt = (codec.bos_id, *codec.encode("You are on a frozen lake. Move:"))
    responses = [(*codec.encode(text), codec.eos_id) for text in (" left", " down please")]
    return [TrainSample(f"t{i}", 0, prompt, response, tuple(-4.0 for _ in response), 0, advantage)
            for i, (response, advantage) in enumerate(zip(responses, (1.0, -1.0), strict=True))]


def test_given_directories_are_chosen_over_the_generated_ones(models: ModelPaths, llama: Path, qwen2: Path) -> None:
    assert resolve_models(_config(models, llama, qwen2)) == ModelPaths(policy=llama.resolve(), serving=qwen2.resolve())
    assert resolve_models(_config(models, policy=qwen2)) == ModelPaths(policy=qwen2.resolve(), serving=models.serving)
    assert resolve_models(_config(models, serving=qwen2)) == ModelPaths(policy=models.policy, serving=qwen2.resolve())
    assert resolve_models(_config(models)) == models


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_the_trainer_trains_and_exports_a_saved_model(architecture: str, request: pytest.FixtureRequest) -> None:
    directory: Path = request.getfixturevalue(architecture)
    trainer = PolicyTrainer.from_config(directory, RLConfig())
    before = trainer.export_weights()
    stats = trainer.train_step(_samples(directory))
    after = trainer.export_weights()
    assert stats.tokens > 0 and math.isfinite(stats.loss)
    assert set(after) == set(iter_safetensors_names(directory)) and tuple(after) == trainer.names
    assert any(not torch.equal(before[name], after[name]) for name in after)
    tied = architecture == "qwen2"
    assert trainer.engine_layout().tie_word_embeddings is tied
    assert ("lm_head.weight" in after) is not tied


def _break(directory: Path, problem: str) -> None:
    if problem == "no config.json":
        (directory / "config.json").unlink()
    elif problem == "no weights":
        for file in directory.glob("*.safetensors"):
            file.unlink()
    elif problem == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (directory / name).unlink()
    elif problem == "no fast tokenizer":
        (directory / "tokenizer.json").unlink()


@pytest.mark.parametrize(
    ("problem", "field", "needle"),
    [
        ("no config.json", "serving", "has no config.json: save it with model.save_pretrained(DIR)"),
        ("no weights", "policy", "has no *.safetensors weights (the trainer and vLLM load safetensors)"),
        ("no tokenizer", "serving", "has no tokenizer (tokenizer.json or tokenizer_config.json): save it with"),
        ("no fast tokenizer", "policy", "has no tokenizer.json (the RL job needs a fast tokenizer)"),
    ],
)
def test_incomplete_directories_are_one_line_errors(
    models: ModelPaths, qwen2: Path, tmp_path: Path, problem: str, field: str, needle: str
) -> None:
    directory = _copy(qwen2, tmp_path)
    _break(directory, problem)
    with pytest.raises(ConfigError) as err:
        resolve_models(_config(models, **{field: directory}))
    text = str(err.value)
    assert f"`model.{field}` = {str(directory)!r}" in text and needle in text and "\n" not in text


def test_a_missing_directory_names_the_fix(models: ModelPaths, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory: fix the path, or leave it empty"):
        resolve_models(_config(models, policy=tmp_path / "nowhere"))


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(models: ModelPaths, tmp_path: Path) -> None:
    small = _save(models, tmp_path, "llama", tied=False, vocab_size=100)
    with pytest.raises(ConfigError) as err:
        resolve_models(_config(models, policy=small))
    assert "its tokenizer has 160 tokens but the model's vocab_size is 100: resize the embeddings" in str(err.value)


def test_the_special_tokens_come_from_the_tokenizer_config(models: ModelPaths, llama: Path, tmp_path: Path) -> None:
    directory = _copy(llama, tmp_path)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings.update(bos_token=None, pad_token=None, eos_token={"content": "<|assistant|>"})
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    codec = load_tokenizer(directory)
    assert codec.bos_id is None and codec.eos_id == codec.pad_id == codec.token_to_id("<|assistant|>")
    settings.update(eos_token=None)
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(ConfigError, match="names no eos_token: set it"):
        resolve_models(_config(models, policy=directory))
