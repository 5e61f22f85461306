"""The host's global random generators (Python's ``random`` and NumPy's legacy ``np.random``) as plain JSON.

Invariant: ``restore_host_rng(json.loads(json.dumps(capture_host_rng())))`` puts both generators back exactly
where they were, so the next ``random.random()`` and ``np.random.rand()`` repeat. Torch's generators are not
here: they are tensors, kept by ``rose_core.app.rl.trainer.trainer_state``."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

_NumpyState = tuple[str, np.ndarray[Any, np.dtype[np.uint32]], int, int, float]


def capture_host_rng() -> dict[str, Any]:
    """Both generators' states as JSON-ready lists and numbers."""
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = cast(_NumpyState, np.random.get_state(legacy=True))
    return {
        "python": [version, list(words), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def restore_host_rng(state: Mapping[str, Any]) -> None:
    """Set both generators from ``capture_host_rng``'s value (a ``ValueError`` names a malformed one)."""
    try:
        version, words, gauss = state["python"]
        name, keys, pos, has_gauss, cached = state["numpy"]
        python_state = (int(version), tuple(int(w) for w in words), gauss)
        numpy_state = (str(name), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed host RNG state ({exc!r}): expected capture_host_rng()'s value") from exc
    random.setstate(python_state)
    np.random.set_state(numpy_state)
