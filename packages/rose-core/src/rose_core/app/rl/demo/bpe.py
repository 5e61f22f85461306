"""A small, deterministic byte-level BPE trainer (GPT-2 / Qwen2 byte alphabet), pure Python.

The demo's tokenizer is tiny (about 160 tokens), so training it here is instant, and breaking ties by the pair
itself keeps it identical across runs and machines (the Rust trainer's hash maps do not promise that).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import pairwise

Pair = tuple[str, str]


@cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (space -> 'Ġ', newline -> 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def byte_level(text: str) -> str:
    """``text`` as UTF-8 bytes written in the byte alphabet."""
    table = byte_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


def ascii_alphabet() -> list[str]:
    """Printable ASCII, tab and newline in the byte alphabet: the base symbols of the demo's tokenizer."""
    return sorted({byte_level(chr(c)) for c in [9, 10, *range(32, 127)]})


@dataclass(slots=True, frozen=True)
class BpeVocabulary:
    """Tokens in id order (after any special tokens) and merges in rank order."""

    tokens: tuple[str, ...]
    merges: tuple[Pair, ...]


def train_bpe(
    word_counts: Mapping[str, int],
    alphabet: Sequence[str],
    size: int,
    forced: Iterable[str] = (),
) -> BpeVocabulary:
    """Merge the most frequent adjacent pair (ties: the smallest pair) until ``size`` tokens exist.

    ``forced`` words (in the byte alphabet) are weighted above the whole corpus, so each ends up a single token.
    Words with symbols outside ``alphabet`` are ignored.
    """
    known = set(alphabet)
    if len(known) > size:
        raise ValueError(f"the alphabet has {len(known)} symbols, more than the {size} tokens asked for: raise size")
    boost = 1 + sum(word_counts.values())
    counts: Counter[tuple[str, ...]] = Counter()
    for word, count in [*word_counts.items(), *((w, boost) for w in forced)]:
        if word and set(word) <= known:
            counts[tuple(word)] += count
    tokens, merges = sorted(known), []
    while len(tokens) < size:
        pair = _best_pair(counts)
        if pair is None:
            break
        merges.append(pair)
        if pair[0] + pair[1] not in tokens:
            tokens.append(pair[0] + pair[1])
        counts = _apply(counts, pair)
    unfinished = [w for w in forced if w not in tokens]
    if unfinished:
        raise ValueError(f"{len(unfinished)} forced words did not fit in {size} tokens: raise size")
    return BpeVocabulary(tokens=tuple(tokens), merges=tuple(merges))


def _best_pair(counts: Mapping[tuple[str, ...], int]) -> Pair | None:
    pairs: Counter[Pair] = Counter()
    for word, count in counts.items():
        for pair in pairwise(word):
            pairs[pair] += count
    if not pairs:
        return None
    return min(pairs, key=lambda p: (-pairs[p], p))


def _apply(counts: Mapping[tuple[str, ...], int], pair: Pair) -> Counter[tuple[str, ...]]:
    merged: Counter[tuple[str, ...]] = Counter()
    for word, count in counts.items():
        merged[_merge_word(word, pair)] += count
    return merged


def _merge_word(word: tuple[str, ...], pair: Pair) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)
