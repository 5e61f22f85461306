"""The embedded demo's generated tokenizer and tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rose_core.app.rl.demo.models import MARKER, VOCAB_SIZE, ModelPaths, ensure_models, load_tokenizer
from rose_core.app.rl.environments.frozenlake import ACTION_WORDS, FrozenLakeEnv
from rose_core.support.errors import RoseError


def test_models_have_the_specified_shapes(models: ModelPaths) -> None:
    policy, serving = AutoConfig.from_pretrained(models.policy), AutoConfig.from_pretrained(models.serving)
    assert policy.architectures == ["LlamaForCausalLM"] and serving.architectures == ["Qwen2ForCausalLM"]
    shape = lambda c: (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.num_hidden_layers)  # noqa: E731
    assert shape(policy) == (128, 4, 2, 2) and policy.intermediate_size == 256 and policy.head_dim == 32
    assert shape(serving) == (256, 4, 4, 2) and serving.intermediate_size == 512 and serving.head_dim == 64
    assert policy.max_position_embeddings == 2048 and policy.tie_word_embeddings is False
    assert policy.vocab_size == serving.vocab_size == VOCAB_SIZE
    for directory in (models.policy, models.serving):
        with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
            assert {handle.get_tensor(k).dtype for k in handle.keys()} == {torch.bfloat16}  # noqa: SIM118


def test_models_load_and_generate_with_transformers(models: ModelPaths) -> None:
    for directory in (models.policy, models.serving):
        model = AutoModelForCausalLM.from_pretrained(directory)
        ids = torch.tensor([[1, 20, 30, 40]])
        out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert out.shape == (1, 7)


def test_both_directories_tokenize_identically_with_a_chat_template(models: ModelPaths) -> None:
    codec = load_tokenizer(models.policy)
    observation = FrozenLakeEnv(seed=1).reset()
    chat = [{"role": "user", "content": "hello, how are you today?"}]
    rendered = []
    for directory in (models.policy, models.serving):
        tokenizer = AutoTokenizer.from_pretrained(directory)
        assert tokenizer(observation, add_special_tokens=False).input_ids == codec.encode(observation)
        rendered.append(tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True))
    assert rendered[0] == rendered[1]
    assert codec.decode(codec.encode(observation)) == observation
    assert codec.vocab_size == VOCAB_SIZE and codec.bos_id is not None and codec.eos_id != codec.pad_id
    for word in ACTION_WORDS:
        assert len(codec.encode(word)) == 1 and len(codec.encode(" " + word)) == 1


def test_generation_is_cached_and_redone_when_interrupted(tmp_path: Path) -> None:
    paths = ensure_models(tmp_path)
    weights = paths.policy / "model.safetensors"
    first_bytes, first_mtime = weights.read_bytes(), weights.stat().st_mtime_ns
    assert json.loads((tmp_path / MARKER).read_text())["fingerprint"]["format"] >= 1
    assert ensure_models(tmp_path) == paths
    assert weights.stat().st_mtime_ns == first_mtime
    (tmp_path / MARKER).unlink()
    (paths.serving / "model.safetensors").unlink()
    ensure_models(tmp_path)
    assert weights.read_bytes() == first_bytes
    assert (paths.serving / "model.safetensors").is_file()


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove"])
def test_a_damaged_cache_is_rebuilt_with_a_warning_naming_the_file(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The marker alone said "complete": a truncated safetensors file was reused and crashed deep in
    transformers or vLLM. Now every file's size and SHA-256 are checked."""
    paths = ensure_models(tmp_path)
    weights = paths.serving / "model.safetensors"
    good = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(good[: len(good) // 2])
    elif damage == "flip":
        weights.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    else:
        weights.unlink()
    with caplog.at_level("WARNING", logger="rose_core.app.rl.demo.models"):
        assert ensure_models(tmp_path) == paths
    assert weights.read_bytes() == good
    assert "serving/model.safetensors" in caplog.text and "rebuilding it" in caplog.text


def test_missing_tokenizer_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(RoseError, match="ensure_models"):
        load_tokenizer(tmp_path)


def test_a_second_directory_is_filled_from_the_users_one_generation(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated once per user, copied into every models directory (each test and working directory used to
    generate its own); a copy, not a link: damage to one directory never reaches the user's generation."""
    from rose_core.app.rl.demo import models as module

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = ensure_models(tmp_path / "a")
    assert module.shared_models_dir().is_relative_to(tmp_path / "cache")

    def no_generation(*_: object) -> None:
        raise AssertionError("generated again")

    monkeypatch.setattr(module, "_generate", no_generation)
    second = ensure_models(tmp_path / "b")
    weights = second.policy / "model.safetensors"
    assert weights.read_bytes() == (first.policy / "model.safetensors").read_bytes()
    weights.write_bytes(b"damaged")
    assert ensure_models(tmp_path / "b") == second and weights.read_bytes() != b"damaged"  # copied again
    assert ensure_models(module.shared_models_dir(), shared=False).policy.is_dir()  # untouched: no generation


def test_an_unusable_user_cache_generates_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-dir"))
    paths = ensure_models(tmp_path / "models")
    assert (paths.policy / "model.safetensors").is_file() and (tmp_path / "models" / MARKER).is_file()
