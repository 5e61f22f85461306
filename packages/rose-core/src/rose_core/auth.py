"""The shared secret that authenticates control-plane peers, and per-message HMAC signatures."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rose_core.errors import ConfigError

SECRET_ENV = "ROSE_SECRET"
SECRET_FILE_ENV = "ROSE_SECRET_FILE"
MAC_BYTES = 32
MIN_SECRET_BYTES = 16


def load_secret(path: str | Path | None = None) -> bytes:
    """The secret from ``path``, else ``$ROSE_SECRET_FILE``, else ``$ROSE_SECRET``."""
    source = str(path) if path else os.environ.get(SECRET_FILE_ENV, "")
    if source:
        try:
            value = Path(source).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the secret file {source}: {exc.strerror}; fix the path") from exc
    else:
        value = os.environ.get(SECRET_ENV, "").strip().encode()
    if not value:
        raise ConfigError(
            f"no shared secret: set {SECRET_FILE_ENV}=PATH (or {SECRET_ENV}) to the controller's secret"
        )
    if len(value) < MIN_SECRET_BYTES:
        raise ConfigError(f"the shared secret is {len(value)} bytes; use at least {MIN_SECRET_BYTES}")
    return value


def write_new_secret(path: Path) -> bytes:
    """Create a random secret readable only by its owner."""
    value = secrets.token_hex(32).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(value)
    return value


class Signer:
    """HMAC-SHA256 over every frame of a message (envelope, header and bulk buffers)."""

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, digestmod=hashlib.sha256)

    def sign(self, frames: Sequence[Any]) -> bytes:
        mac = self._key.copy()
        for frame in frames:
            mac.update(frame)
        return mac.digest()

    def verify(self, mac: bytes, frames: Sequence[Any]) -> bool:
        return hmac.compare_digest(mac, self.sign(frames))
