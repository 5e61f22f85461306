"""The old values at every place a version overwrote in resident weights, to put them back.

A patch overwrites only its changed words, so the log of a sparse version is O(changes): the
positions and the words they held. Rolling back restores them in reverse order, bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np


class UndoLog:
    def __init__(self) -> None:
        self._entries: list[tuple[np.ndarray, Any, np.ndarray]] = []

    def overwrite(self, target: np.ndarray, index: Any, values: np.ndarray) -> None:
        """``target[index] = values``, remembering what ``target[index]`` held (a copy)."""
        old = target[index] if isinstance(index, np.ndarray) else target[index].copy()  # a gather copies
        self._entries.append((target, index, old))
        target[index] = values

    def rollback(self) -> None:
        """Put every overwritten value back; the log is empty afterwards."""
        for target, index, old in reversed(self._entries):
            target[index] = old
        self._entries.clear()

    def clear(self) -> None:
        self._entries.clear()

    @property
    def nbytes(self) -> int:
        """Bytes the log holds (old values and positions)."""
        return sum(old.nbytes + getattr(index, "nbytes", 0) for _, index, old in self._entries)
