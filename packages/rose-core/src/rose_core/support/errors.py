"""Errors a user or a peer can meet. Each message names the cause and the fix in one line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class RoseError(Exception):
    """An error meant for a person: printed as one line by the CLI, never as a traceback."""


class ConfigError(RoseError):
    """A configuration value is wrong; the message names the field and the fix."""


class MissingExtraError(RoseError):
    """An optional dependency is needed; the message names the pip command that installs it."""

    def __init__(self, what: str, install: str) -> None:
        super().__init__(f"{what} is not installed: run `pip install {install}`")
        self.install = install


@contextmanager
def require_extra(what: str, install: str) -> Iterator[None]:
    """The one guard for an optional dependency: the imports stay plain statements (seen by grep, mypy and the
    import contracts) inside ``with require_extra("torch", "rose-core[train]"): import torch``; an
    ``ImportError`` there becomes a ``MissingExtraError`` that names the pip command."""
    try:
        yield
    except ImportError as exc:
        raise MissingExtraError(what, install) from exc


class ProtocolError(Exception):
    """A frame was rejected. ``reason`` is the label of ``rose_rejected_messages_total``."""

    REASONS = (
        "malformed",
        "oversized",
        "unauthenticated",
        "unknown_type",
        "wrong_version",
        "no_handshake",
        "wrong_role",
        "not_owner",
        "replay",
        "over_capacity",
        "needs_tls",
        "oversized_notice",
        "notice_flood",
        "inbox_full",
    )

    def __init__(self, reason: str, message: str) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        super().__init__(message)
        self.reason = reason
