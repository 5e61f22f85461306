"""Errors of the weight data plane. Messages name the cause and the fix in one line."""

from __future__ import annotations

from rose_core.errors import RoseError


class TransferError(RoseError):
    """A weight version could not be moved; nothing of it was applied."""


class BucketCorrupt(Exception):
    """One received bucket failed its signature or checksum; the fetcher pulls it again."""
