"""Levels (ok / warn / bad / idle) as CSS classes, so colours live in the stylesheet."""

from __future__ import annotations

from textual.widget import Widget

from rose_tui.formatting import Level

LEVEL_CLASSES = ("-ok", "-warn", "-bad", "-idle")


def set_level(widget: Widget, level: Level | None) -> None:
    """Give ``widget`` exactly the class of ``level`` (none for ``None``)."""
    wanted = f"-{level}" if level else None
    for name in LEVEL_CLASSES:
        widget.set_class(name == wanted, name)
