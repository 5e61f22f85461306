"""The user's cache directory for what ROSE builds once and reuses across runs and working directories (start-up
latency profiles, the demo's generated models): ``$XDG_CACHE_HOME/rose`` or ``~/.cache/rose``."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(*parts: str) -> Path:
    """``<cache>/rose/<parts...>`` (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base, "rose", *parts)
