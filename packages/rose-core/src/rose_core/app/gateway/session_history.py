"""The token history of one gateway session: what the policy saw and said, never re-tokenised.

A session is a run of calls. Each call's prompt is the session's current segment extended by the call's new
material, and each reply's tokens are appended exactly as sampled. The history is compared by *text*: after a
reply, ``key`` is the text the segment's tokens stand for (the rendered prompt followed by the reply's text,
and the end-of-turn token's text when the reply ended with it). The next call extends the segment when its
rendered prompt starts with ``key``: only the rest is tokenised. Otherwise (an agent that edits its history,
a template that rewrites earlier turns) a new segment starts from the whole rendered prompt.

Invariants: every segment has ``len(tokens) == len(mask)``; ``mask[i] == 1`` exactly for sampled tokens; a
call's prompt is always the whole current segment; ``encoded_tokens`` counts every token the tokenizer
produced for this session (the history test reads it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Encode = Callable[[str], list[int]]


@dataclass(slots=True)
class Segment:
    """One token sequence of a session and its response mask (1: sampled, 0: prompt, tool and user tokens)."""

    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SessionHistory:
    segments: list[Segment] = field(default_factory=list)
    key: str | None = None
    """The text the current segment stands for after the last reply; None: the next call starts a segment."""
    encoded_tokens: int = 0
    _pending: int = 0
    """Tokens of the current segment before the call in flight added its new material (to undo a failed call)."""

    def prompt_for_text(self, rendered: str, encode: Encode) -> list[int]:
        """The prompt of a call whose rendered text is ``rendered``: the current segment extended by the
        tokens of what follows ``key``, or a new segment of the whole text."""
        if self.key is not None and rendered.startswith(self.key):
            return self._extend(encode(rendered[len(self.key):]))
        return self._restart(encode(rendered))

    def prompt_for_tokens(self, tokens: Sequence[int]) -> list[int]:
        """The prompt of a call that sends token ids: nothing is tokenised; the segment is extended when the
        ids start with it (a new one starts otherwise). Exact by construction: no ``key`` needed."""
        current = self.segments[-1].tokens if self.segments else None
        if current is not None and len(tokens) >= len(current) and list(tokens[: len(current)]) == current:
            return self._extend(list(tokens[len(current):]), count=False)
        return self._restart(list(tokens), count=False)

    def add_reply(self, tokens: Sequence[int], key: str | None) -> None:
        """Append the sampled ``tokens`` to the segment; ``key``: the text it now stands for (None: the next
        call starts a new segment)."""
        segment = self.segments[-1]
        segment.tokens.extend(tokens)
        segment.mask.extend([1] * len(tokens))
        self.key = key

    def drop_pending(self) -> None:
        """The call in flight failed: take its new prompt tokens off again (the next call re-sends them)."""
        segment = self.segments[-1]
        del segment.tokens[self._pending:], segment.mask[self._pending:]
        if not segment.tokens:  # it had started a segment: the previous one (and ``key``) is current again
            self.segments.pop()

    def _extend(self, new: list[int], *, count: bool = True) -> list[int]:
        segment = self.segments[-1]
        self._pending = len(segment.tokens)
        segment.tokens.extend(new)
        segment.mask.extend([0] * len(new))
        self.encoded_tokens += len(new) if count else 0
        return list(segment.tokens)

    def _restart(self, tokens: list[int], *, count: bool = True) -> list[int]:
        self.segments.append(Segment(list(tokens), [0] * len(tokens)))
        self._pending = 0
        self.encoded_tokens += len(tokens) if count else 0
        return list(tokens)
