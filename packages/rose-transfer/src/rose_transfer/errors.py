"""Errors of the weight data plane. Messages name the cause and the fix in one line."""

from __future__ import annotations

from typing import Any

from rose_core.protocol.wire import is_unsigned_notice
from rose_core.support.errors import RoseError


class TransferError(RoseError):
    """A weight version could not be moved; nothing of it was applied."""


class BucketRefused(TransferError):
    """One bucket failed its signature or checksum more often than allowed from one source. Through a relay,
    the fetcher takes the version from the source instead (a relay may serve forged or damaged bytes)."""


class BucketCorrupt(Exception):
    """One received bucket failed its signature or checksum; the fetcher pulls it again."""


class UntrustedNotice(ConnectionError):
    """An unsigned notice came where a signed reply was due. Anyone on the path can forge one, so it is not
    acted on: the connection is treated as broken (retried, then the source fallen back from), and the
    notice's text is kept for the error a person reads if the retries run out."""


def refuse_unsigned(reply: Any, source: str) -> None:
    """Raise ``UntrustedNotice`` if ``reply`` is an unsigned notice (``Framer`` marks every one it opens)."""
    if is_unsigned_notice(reply):
        raise UntrustedNotice(f"{source} sent an unsigned notice ({reply.code}: {reply.message}); not trusted")
