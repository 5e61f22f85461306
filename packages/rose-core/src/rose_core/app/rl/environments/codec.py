"""The tokenizer interface the pure RL code needs (``rose_core.app.rl.demo.models.load_tokenizer`` provides one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class TextCodec(Protocol):
    """Text <-> token ids without special tokens added; ``bos_id`` starts every prompt when not None."""

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...
