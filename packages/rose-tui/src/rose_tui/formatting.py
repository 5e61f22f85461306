"""How numbers read on the dashboard: units, widths, and their level against a limit. Pure functions."""

from __future__ import annotations

from typing import Literal

Level = Literal["ok", "warn", "bad", "idle"]
"""How a value stands: within its limit, close to it, past it, or not applicable."""

DASH = "-"
WARN_FRACTION = 0.8
"""A latency above this fraction of its SLO (or a KV usage above it) is shown as a warning."""
KV_BAD_RATIO = 0.9


def slo_level(value_ms: float | None, slo_ms: float) -> Level:
    """``ok`` under 80% of the SLO, ``warn`` up to the SLO, ``bad`` past it; ``idle`` without data or SLO."""
    if value_ms is None or slo_ms <= 0:
        return "idle"
    if value_ms > slo_ms:
        return "bad"
    if value_ms > WARN_FRACTION * slo_ms:
        return "warn"
    return "ok"


def ratio_level(ratio: float) -> Level:
    if ratio >= KV_BAD_RATIO:
        return "bad"
    if ratio >= WARN_FRACTION:
        return "warn"
    return "ok"


def format_ms(value_ms: float | None) -> str:
    if value_ms is None:
        return DASH
    if value_ms >= 10_000:
        return f"{value_ms / 1000:.1f} s"
    if value_ms >= 100:
        return f"{value_ms:.0f} ms"
    return f"{value_ms:.1f} ms"


def format_ratio(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


def format_bytes(n: int) -> str:
    """Binary units: ``512 B``, ``1.5 KiB``, ``340 MiB``, ``2.10 GiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    if value >= 100:
        return f"{value:.0f} {unit}"
    if value >= 10:
        return f"{value:.1f} {unit}"
    return f"{value:.2f} {unit}"


def format_seconds(seconds: float) -> str:
    """A short duration: ``0.42 s``, ``12.3 s``, ``4m05s``."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_clock(seconds: float) -> str:
    """An elapsed time as ``HH:MM:SS`` (hours grow past 99 if they must)."""
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def format_age(seconds: float) -> str:
    """How long ago something was seen: ``0.4s``, ``12s``, ``3m``, ``2h``."""
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f}s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def format_reward(reward: float | None) -> str:
    return DASH if reward is None else f"{reward:+.3f}"
