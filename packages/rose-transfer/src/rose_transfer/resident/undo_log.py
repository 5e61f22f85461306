"""The old words a version's patches overwrote in resident weights, to put them back.

A patch overwrites only its changed words, so the log of a sparse version is O(changes): the old
words, in one buffer reused from version to version (no fresh pages while a version is applied). The
positions are not kept: a rollback decodes them again from the patches, which the log holds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rose_transfer.codec.sparse_patch import ParsedPatch, patch_blocks


@dataclass(slots=True)
class Patched:
    """One patch written over ``words``: its first ``done`` changes, whose old words start at ``at``."""

    words: np.ndarray
    patch: ParsedPatch
    at: int
    done: int = 0
    tail: tuple[np.ndarray, np.ndarray] | None = None  # (the bucket's tail, its old bytes)


class UndoLog:
    def __init__(self) -> None:
        self._old = np.empty(0, dtype=np.uint8)
        self._used = 0
        self._entries: list[Patched] = []

    def start(self, nbytes: int) -> None:
        """Start an empty log with room for ``nbytes`` of old words (no growing copies on the way)."""
        self.clear()
        if self._old.nbytes < nbytes:
            self._old = np.empty(nbytes, dtype=np.uint8)

    def begin(self, words: np.ndarray, patch: ParsedPatch) -> Patched:
        """Log a patch about to be written over ``words``; ``overwrite`` then writes it block by block."""
        need = self._used + patch.count * patch.word_bytes
        if self._old.nbytes < need:
            grown = np.empty(max(need, 2 * self._old.nbytes), dtype=np.uint8)
            grown[: self._used] = self._old[: self._used]
            self._old = grown
        entry = Patched(words, patch, self._used)
        self._entries.append(entry)
        self._used = need
        return entry

    def overwrite(self, entry: Patched, positions: np.ndarray, values: np.ndarray) -> None:
        """``entry.words[positions] = values`` (the patch's next block), keeping the old words."""
        np.take(entry.words, positions, out=self._old_words(entry, entry.done, positions.size))
        entry.words[positions] = values
        entry.done += positions.size

    def overwrite_tail(self, entry: Patched, tail: np.ndarray, values: np.ndarray) -> None:
        entry.tail = (tail, tail.copy())
        tail[:] = values

    def rollback(self) -> None:
        """Put every overwritten word back; the log is empty afterwards."""
        for entry in reversed(self._entries):
            if entry.tail is not None:
                entry.tail[0][:] = entry.tail[1]
            blocks, restored = patch_blocks(entry.patch), 0
            while restored < entry.done:  # the blocks written decode again as they did (checked first)
                positions, _ = next(blocks)
                n = min(positions.size, entry.done - restored)
                entry.words[positions[:n]] = self._old_words(entry, restored, n)
                restored += n
        self.clear()

    def clear(self) -> None:
        self._entries.clear()
        self._used = 0

    @property
    def nbytes(self) -> int:
        """Bytes of old words the log holds now."""
        return self._used

    def _old_words(self, entry: Patched, first: int, count: int) -> np.ndarray:
        start = entry.at + first * entry.words.itemsize
        return self._old[start : start + count * entry.words.itemsize].view(entry.words.dtype)
