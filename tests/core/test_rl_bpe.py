"""The demo tokenizer's byte-level BPE trainer: deterministic, forced words become single tokens."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rose_core.app.rl.demo.bpe import ascii_alphabet, byte_level, byte_to_unicode, train_bpe
from rose_core.app.rl.demo.corpus import corpus_lines


def test_byte_alphabet_is_a_bijection() -> None:
    table = byte_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert byte_level(" left\n") == "ĠleftĊ"
    assert len(ascii_alphabet()) == 97


@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40))
def test_byte_level_stays_in_the_ascii_alphabet(text: str) -> None:
    assert set(byte_level(text)) <= set(ascii_alphabet())


def _counts() -> Counter[str]:
    return Counter(byte_level(w) for line in corpus_lines(0, episodes=20) for w in line.split(" ") if w)


def test_training_is_deterministic_and_forces_words() -> None:
    forced = [byte_level(" right"), byte_level("down")]
    first = train_bpe(_counts(), ascii_alphabet(), 140, forced)
    second = train_bpe(_counts(), ascii_alphabet(), 140, forced)
    assert first == second
    assert len(first.tokens) == 140 == len(set(first.tokens))
    assert set(forced) <= set(first.tokens)
    assert all(a + b in first.tokens for a, b in first.merges)


def test_too_small_a_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match="raise size"):
        train_bpe(_counts(), ascii_alphabet(), 50)
    with pytest.raises(ValueError, match="forced"):
        train_bpe({}, ascii_alphabet(), 98, [byte_level("abcdef")])
