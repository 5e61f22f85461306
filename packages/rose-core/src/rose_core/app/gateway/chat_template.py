"""The policy's chat template, rendered to text exactly as Hugging Face renders it (the gateway's one
transformers importer). Tokenising is not done here: the session history tokenises only what is new, with
the job's own tokenizer (``rose_core.app.rl.demo.models.TokenizerCodec``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rose_core.support.errors import ConfigError, RoseError, require_extra


class ChatTemplate:
    """``render(messages)``: the prompt text of a chat call (generation prompt added); ``eos_text``: the text
    of the policy's end-of-sequence token, which a template writes after an assistant message; ``tokenizer``:
    the policy's Hugging Face tokenizer (what vLLM's reply parsers read)."""

    def __init__(self, policy_dir: Path) -> None:
        with require_extra("transformers (the gateway's chat template)", "rose-core[train]"):
            import transformers

        try:
            self.tokenizer: Any = transformers.AutoTokenizer.from_pretrained(str(policy_dir))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the tokenizer of {policy_dir} for the gateway ({exc}): "
                              "save it with tokenizer.save_pretrained(DIR)") from exc
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"the policy at {policy_dir} has no chat template: the gateway's chat API needs one "
                              "(set tokenizer.chat_template and save it again), or use /v1/completions")
        self.eos_text: str = str(self.tokenizer.eos_token or "")

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The rendered prompt; a ``RoseError`` naming the problem when the template rejects the messages."""
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tools=list(tools) if tools else None, tokenize=False,
                add_generation_prompt=True,
            )
        except Exception as exc:  # the template's own errors (raise_exception, undefined fields) are the user's
            raise RoseError(f"the policy's chat template rejected the messages: {exc}") from exc
        return str(text)
