"""The embedded demo's tiny models, generated locally (no model hub): a byte-level BPE tokenizer, the policy
(Llama) and the differently shaped serving model (Qwen2), both bf16 safetensors that vLLM's CPU backend loads.

This module, ``trainer.py`` and ``trainer_state.py`` are the only ones that import the ``[train]`` extra
(torch, transformers, tokenizers, safetensors); this one only inside functions, so ``import rose_core.app.rl`` works
without it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import unicodedata
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rose_core.app.rl.demo.bpe import ascii_alphabet, byte_level, train_bpe
from rose_core.app.rl.demo.corpus import corpus_lines
from rose_core.app.rl.environments.frozenlake import ACTION_WORDS
from rose_core.support.errors import RoseError, require_extra
from rose_core.support.user_cache import user_cache_dir

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)
TRAIN_EXTRA = "rose-core[train]"
GENERATION_SEED = 1234
FORMAT_VERSION = 2
VOCAB_SIZE = 160
MARKER = "rose-models.json"
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, *ROLE_TOKENS)
SPLIT_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
"""Qwen2's pre-tokenizer split (transformers rebuilds any ``qwen2`` tokenizer with it)."""
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(slots=True, frozen=True)
class TinyModelSpec:
    architecture: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    intermediate_size: int
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        if self.architecture not in ("LlamaForCausalLM", "Qwen2ForCausalLM"):
            raise ValueError(f"unknown architecture {self.architecture!r}: use LlamaForCausalLM or Qwen2ForCausalLM")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("hidden size, attention heads and kv heads must divide evenly")
        if self.head_dim < 32:
            raise ValueError(f"head_dim {self.head_dim} < 32: vLLM's CPU attention needs head_dim >= 32")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


POLICY_SPEC = TinyModelSpec("LlamaForCausalLM", 128, 4, 2, 2, 256)
SERVING_SPEC = TinyModelSpec("Qwen2ForCausalLM", 256, 4, 4, 2, 512)


@dataclass(slots=True, frozen=True)
class ModelPaths:
    """Hugging Face model directories (config, bf16 safetensors, tokenizer with a chat template)."""

    policy: Path
    serving: Path


class TokenizerCodec:
    """Text <-> ids over a ``tokenizers.Tokenizer``; ``encode`` adds no special tokens. ``bos``, ``eos`` and
    ``pad`` name the special tokens (the demo's by default); no ``bos``: prompts start without one, no ``pad``:
    padding uses ``eos``."""

    __slots__ = ("_tokenizer", "bos_id", "eos_id", "pad_id")

    def __init__(self, tokenizer: Tokenizer, *, bos: str | None = BOS, eos: str = EOS, pad: str | None = PAD) -> None:
        self._tokenizer = tokenizer
        self.bos_id: int | None = None if bos is None else _token_id(tokenizer, bos)
        self.eos_id: int = _token_id(tokenizer, eos)
        self.pad_id: int = self.eos_id if pad is None else _token_id(tokenizer, pad)

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)


def load_tokenizer(path: Path) -> TokenizerCodec:
    """The tokenizer saved in a model directory (``path/tokenizer.json``) or at ``path`` itself; its special
    tokens are the ones its ``tokenizer_config.json`` names, when it has one (else the demo's)."""
    with require_extra("tokenizers", TRAIN_EXTRA):
        import tokenizers
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise RoseError(f"no tokenizer at {file}: run ensure_models() or point at a model directory")
    return TokenizerCodec(tokenizers.Tokenizer.from_file(str(file)), **_special_tokens(file.parent))


def _special_tokens(directory: Path) -> dict[str, Any]:
    """``bos`` / ``eos`` / ``pad`` as ``tokenizer_config.json`` in ``directory`` names them (a string or
    ``{"content": ...}``); the demo's when there is no such file."""
    file = directory / "tokenizer_config.json"
    if not file.is_file():
        return {}
    try:
        settings = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise RoseError(f"cannot read {file} ({exc}): re-save it with tokenizer.save_pretrained()") from exc
    names = {key: _token_name(settings.get(f"{key}_token")) for key in ("bos", "eos", "pad")}
    if names["eos"] is None:
        raise RoseError(f"{file} names no eos_token: set it (the token that ends a turn) and re-save the tokenizer")
    return names


def _token_name(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def ensure_models(cache_dir: Path, *, shared: bool = True) -> ModelPaths:
    """Generate the tokenizer and both models under ``cache_dir`` once; later calls reuse them.

    A marker written last records what was generated and the size and SHA-256 of every file, so an
    interrupted or outdated generation, or a damaged cache (a truncated or edited file, one missing), is
    rebuilt, with a warning naming the file. Concurrent callers serialize on a lock file. With ``shared`` (the
    default) they are generated once per user (``shared_models_dir()``) and copied from there: every working
    directory and test of one user reuses one generation.
    """
    paths = ModelPaths(policy=cache_dir / "policy", serving=cache_dir / "serving")
    if _is_complete(cache_dir):
        return paths
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_complete(cache_dir) and not (shared and _copied_from_shared(cache_dir)):
            _generate(cache_dir, paths)
    return paths


def shared_models_dir() -> Path:
    """The user's one generation of this version of the models (``~/.cache/rose/demo-models/<fingerprint>``)."""
    key = hashlib.sha256(json.dumps(_fingerprint(), sort_keys=True).encode()).hexdigest()[:16]
    return user_cache_dir("demo-models", key)


def _copied_from_shared(cache_dir: Path) -> bool:
    """Fill ``cache_dir`` from the user's shared generation (made first if missing); False (and generate in
    place) when the user's cache cannot be written or read."""
    source = shared_models_dir()
    if source.resolve() == cache_dir.resolve():
        return False
    try:
        ensure_models(source, shared=False)
        (cache_dir / MARKER).unlink(missing_ok=True)
        for name in ("policy", "serving"):
            shutil.rmtree(cache_dir / name, ignore_errors=True)
            shutil.copytree(source / name, cache_dir / name)
        temporary = cache_dir / f"{MARKER}.tmp"
        shutil.copyfile(source / MARKER, temporary)
        temporary.replace(cache_dir / MARKER)
    except OSError as exc:
        log.info("the user's model cache at %s is not usable (%s): generating in %s", source, exc, cache_dir)
        return False
    return _is_complete(cache_dir)


def _fingerprint() -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "seed": GENERATION_SEED,
        "vocab_size": VOCAB_SIZE,
        "policy": asdict(POLICY_SPEC),
        "serving": asdict(SERVING_SPEC),
    }


def _is_complete(cache_dir: Path) -> bool:
    try:
        marker = json.loads((cache_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("fingerprint") != _fingerprint():
        return False
    damage = _damage(cache_dir, marker.get("files"))
    if damage:
        log.warning("the model cache at %s is damaged (%s): rebuilding it", cache_dir, damage)
    return not damage


def _file_digests(cache_dir: Path) -> dict[str, list[Any]]:
    """Every file of both model directories: relative path -> [size, sha256]."""
    out: dict[str, list[Any]] = {}
    for name in ("policy", "serving"):
        for file in sorted((cache_dir / name).rglob("*")):
            if file.is_file():
                out[str(file.relative_to(cache_dir))] = [file.stat().st_size, _sha256(file)]
    return out


def _damage(cache_dir: Path, recorded: object) -> str:
    """What differs from the marker's file list ('' when nothing does)."""
    if not isinstance(recorded, dict) or not recorded:
        return "no file list in its marker"
    for name, entry in recorded.items():
        if not (isinstance(entry, list) and len(entry) == 2):
            return f"its marker's entry for {name} is unreadable"
        size, digest = entry
        file = cache_dir / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} is {file.stat().st_size} bytes, was {size}"
        if _sha256(file) != digest:
            return f"{name} changed"
    return ""


def _sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def _generate(cache_dir: Path, paths: ModelPaths) -> None:
    (cache_dir / MARKER).unlink(missing_ok=True)
    for directory in (paths.policy, paths.serving):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    tokenizer = build_tokenizer()
    for directory in (paths.policy, paths.serving):
        _save_tokenizer(tokenizer, directory)
    _save_model(POLICY_SPEC, tokenizer, paths.policy)
    _save_model(SERVING_SPEC, tokenizer, paths.serving)
    temporary = cache_dir / f"{MARKER}.tmp"
    temporary.write_text(json.dumps({"fingerprint": _fingerprint(), "files": _file_digests(cache_dir)}, indent=1))
    temporary.replace(cache_dir / MARKER)


def build_tokenizer() -> Tokenizer:
    """A byte-level BPE over printable ASCII, trained on the demo corpus with the action words forced in as
    single tokens (with and without a leading space).

    Its pipeline (NFC, Qwen2's split regex, byte-level) is the one transformers imposes on every ``qwen2``
    model directory, so the policy (Llama) and the serving model (Qwen2) tokenize identically.
    """
    with require_extra("tokenizers", TRAIN_EXTRA):
        import tokenizers
    pipeline = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split(tokenizers.Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    counts = Counter(
        word
        for line in corpus_lines(GENERATION_SEED)
        for word, _ in pipeline.pre_tokenize_str(unicodedata.normalize("NFC", line))
    )
    forced = [byte_level(prefix + word) for word in ACTION_WORDS for prefix in ("", " ")]
    trained = train_bpe(counts, ascii_alphabet(), VOCAB_SIZE - len(SPECIAL_TOKENS), forced)
    vocabulary = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *trained.tokens])}
    model = tokenizers.models.BPE(vocab=vocabulary, merges=list(trained.merges), unk_token=None, fuse_unk=False)
    tokenizer: Tokenizer = tokenizers.Tokenizer(model)
    tokenizer.normalizer = tokenizers.normalizers.NFC()
    tokenizer.pre_tokenizer = pipeline
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def _save_tokenizer(tokenizer: Tokenizer, directory: Path) -> None:
    with require_extra("transformers", TRAIN_EXTRA):
        import transformers
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=POLICY_SPEC.max_position_embeddings,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(str(directory))


def _save_model(spec: TinyModelSpec, tokenizer: Tokenizer, directory: Path) -> None:
    with require_extra("torch", TRAIN_EXTRA):
        import torch
    with require_extra("transformers", TRAIN_EXTRA):
        import transformers
    config_class = transformers.LlamaConfig if spec.architecture == "LlamaForCausalLM" else transformers.Qwen2Config
    model_class = getattr(transformers, spec.architecture)
    config = config_class(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.token_to_id(BOS),
        eos_token_id=tokenizer.token_to_id(EOS),
        pad_token_id=tokenizer.token_to_id(PAD),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(GENERATION_SEED)
        model = model_class(config)
    with quiet_progress():
        model.to(torch.bfloat16).save_pretrained(str(directory))


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    found = tokenizer.token_to_id(token)
    if found is None:
        raise RoseError(
            f"the tokenizer has no {token} token: fix the special tokens of its tokenizer_config.json, or "
            "regenerate the demo models with ensure_models()"
        )
    return int(found)


@contextmanager
def quiet_progress() -> Iterator[None]:
    """Silence transformers' progress bars (weights loading, shard writing) for the duration."""
    with require_extra("transformers", TRAIN_EXTRA):
        from transformers.utils import logging as progress
    enabled = progress.is_progress_bar_enabled()
    progress.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            progress.enable_progress_bar()


def iter_safetensors_names(directory: Path) -> Iterator[str]:
    """Tensor names stored in a model directory's safetensors files (what vLLM's weight loader expects)."""
    with require_extra("safetensors", TRAIN_EXTRA):
        import safetensors
    for file in sorted(directory.glob("*.safetensors")):
        with safetensors.safe_open(str(file), framework="pt") as handle:
            yield from handle.keys()
