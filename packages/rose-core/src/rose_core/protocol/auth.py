"""The shared secret that authenticates peers, the per-role keys derived from it, and per-message signatures.

Roles (docs/security.md): the secret is the controller's and the trainer's (full authority); an executor
holds an *executor key* file (``write_executor_key``): its own control key, bound to its executor id, the
weights key and the observer key, none of which gives back the secret or another executor's key; a
dashboard holds the observer key. Every key is ``HMAC-SHA256(secret, label)``.

Two schemes, both keyed by the shared secret: HMAC-SHA256 (every control message, and the default),
and Poly1305 with a one-time key per message (``HMAC-SHA256(secret, label + nonce)`` over a random
16-byte nonce; the mac frame is ``nonce + tag``), the ChaCha20-Poly1305 construction without the
cipher. Poly1305 runs about 7x faster than HMAC-SHA256 here (12.8 vs 1.8 GB/s per core), which is
what lets a weight bucket of 64 MiB be authenticated at link speed. It needs ``cryptography``."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rose_core.support.errors import ConfigError, require_extra

SECRET_ENV = "ROSE_SECRET"
SECRET_FILE_ENV = "ROSE_SECRET_FILE"
MAC_BYTES = 32
MIN_SECRET_BYTES = 16
HMAC_SHA256 = "hmac-sha256"
POLY1305 = "poly1305"
MAC_SCHEMES = (HMAC_SHA256, POLY1305)
_NONCE_BYTES = 16
_ONE_TIME_KEY_LABEL = b"rose-poly1305-key\x00"
OBSERVER_KEY_PREFIX = b"rose-observer-key:"
"""How an observer key file starts (``write_observer_key``); anything else is read as the shared secret."""
_OBSERVER_LABEL = b"rose-observer-key\x00"
EXECUTOR_KEY_PREFIX = b"rose-executor-key:"
"""How an executor key file starts (``write_executor_key``)."""
_EXECUTOR_LABEL = b"rose-executor-key\x00"
_WEIGHTS_LABEL = b"rose-weights-key\x00"


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
        raise ConfigError(f"no shared secret: set {SECRET_FILE_ENV}=PATH (or {SECRET_ENV}) to the controller's secret")
    if len(value) < MIN_SECRET_BYTES:
        raise ConfigError(f"the shared secret is {len(value)} bytes; use at least {MIN_SECRET_BYTES}")
    return value


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, created readable only by its owner (mode 0600 from the start, never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_new_secret(path: Path) -> bytes:
    """Create a random secret readable only by its owner."""
    value = secrets.token_hex(32).encode()
    write_private(path, value)
    return value


def observer_key(secret: bytes) -> bytes:
    """The observer's credential, derived from the shared secret: a controller accepts messages signed with it
    only from a watcher (``Hello`` as an observer, ``Goodbye``) and signs what it sends that peer with it. It
    cannot be turned back into the secret, so a dashboard given only this key can watch and do nothing else."""
    return hmac.new(secret, _OBSERVER_LABEL, hashlib.sha256).hexdigest().encode()


def as_observer(credential: bytes) -> bytes:
    """The observer key held in ``credential``: an observer key file's contents, or derived from the secret."""
    if credential.startswith(OBSERVER_KEY_PREFIX):
        return credential[len(OBSERVER_KEY_PREFIX) :]
    return observer_key(credential)


def write_observer_key(path: Path, secret: bytes) -> None:
    """Write the observer key of ``secret`` to ``path`` (readable only by its owner): what a dashboard gets."""
    write_private(path, OBSERVER_KEY_PREFIX + observer_key(secret))


def executor_key(secret: bytes, executor_id: str) -> bytes:
    """Executor ``executor_id``'s control key: the controller accepts it only on the connection whose routing
    id is ``executor_id`` and only for messages that name that executor (``rose_core.protocol.wire``)."""
    return hmac.new(secret, _EXECUTOR_LABEL + executor_id.encode(), hashlib.sha256).hexdigest().encode()


@lru_cache(maxsize=4096)
def executor_signer(secret: bytes, executor_id: str) -> Signer:
    """A ``Signer`` of ``executor_key`` (cached: the control socket derives one per message otherwise)."""
    return Signer(executor_key(secret, executor_id))


def weights_key(secret: bytes) -> bytes:
    """The weight channel's key: publishers, relays and receivers sign and verify with it (and its TLS key is
    derived from it); a trainer's shard intake keeps the secret, so an executor cannot publish through it."""
    return hmac.new(secret, _WEIGHTS_LABEL, hashlib.sha256).hexdigest().encode()


@dataclass(frozen=True, slots=True)
class ExecutorCredential:
    """What an executor signs with: its control key, the weights key, and the observer key (which its
    encrypted control link derives the controller's Curve key from)."""

    executor_id: str
    control: bytes
    weights: bytes
    observer: bytes


def executor_credential(contents: bytes, executor_id: str) -> ExecutorCredential:
    """The credential in ``contents`` (an executor key file, or the shared secret, from which it is derived)
    for ``executor_id``; ``ConfigError`` naming the fix for another executor's key or an observer key."""
    if contents.startswith(OBSERVER_KEY_PREFIX):
        raise ConfigError("this is an observer key (it can only watch): give the executor its executor key "
                          "(executor-ID.key in the controller's run directory) or the shared secret")
    if not contents.startswith(EXECUTOR_KEY_PREFIX):
        return ExecutorCredential(executor_id, executor_key(contents, executor_id), weights_key(contents),
                                  observer_key(contents))
    fields = _executor_key_fields(contents)
    owner = fields[0].decode(errors="replace")
    if owner != executor_id:
        raise ConfigError(f"this executor key is executor {owner!r}'s: start with --executor-id {owner}, or give "
                          f"executor {executor_id!r} its own key (executor-{executor_id}.key)")
    return ExecutorCredential(owner, fields[1], fields[2], fields[3])


def write_executor_key(path: Path, secret: bytes, executor_id: str) -> None:
    """Write executor ``executor_id``'s key file (readable only by its owner): what its host gets instead of
    the secret."""
    if not executor_id or len(executor_id) > 128 or any(c.isspace() for c in executor_id):
        raise ConfigError(f"bad executor id {executor_id!r}: use 1-128 characters without spaces")
    keys = (executor_key(secret, executor_id), weights_key(secret), observer_key(secret))
    write_private(path, EXECUTOR_KEY_PREFIX + b" ".join((executor_id.encode(), *keys)))


def as_weights_key(credential: bytes) -> bytes:
    """The weights key held in ``credential``: an executor key file's, or derived from the secret."""
    if credential.startswith(OBSERVER_KEY_PREFIX):
        raise ConfigError("an observer key cannot fetch or serve weights: give the shared secret or an executor key")
    if credential.startswith(EXECUTOR_KEY_PREFIX):
        return _executor_key_fields(credential)[2]
    return weights_key(credential)


def _executor_key_fields(contents: bytes) -> list[bytes]:
    """ID, control, weights and observer key of an executor key file's ``contents``."""
    fields = contents[len(EXECUTOR_KEY_PREFIX):].split()
    if len(fields) != 4:
        raise ConfigError("malformed executor key file (expected 'rose-executor-key:ID CONTROL WEIGHTS OBSERVER'): "
                          "write it again beside the secret with `rose executor-key ID`")
    return fields


class Signer:
    """A ``MAC_BYTES`` signature over every frame of a message (envelope, header and bulk buffers):
    HMAC-SHA256 (``sign``/``verify``) or Poly1305 with a one-time key (``sign_fast``/``verify_fast``)."""

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, digestmod=hashlib.sha256)

    def sign(self, frames: Sequence[Any]) -> bytes:
        mac = self._key.copy()
        for frame in frames:
            mac.update(frame)
        return mac.digest()

    def verify(self, mac: bytes, frames: Sequence[Any]) -> bool:
        return hmac.compare_digest(mac, self.sign(frames))

    def sign_fast(self, frames: Sequence[Any]) -> bytes:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        return nonce + self._poly1305_tag(nonce, frames)

    def verify_fast(self, mac: bytes, frames: Sequence[Any]) -> bool:
        if len(mac) != MAC_BYTES:
            return False
        nonce = mac[:_NONCE_BYTES]
        return hmac.compare_digest(mac[_NONCE_BYTES:], self._poly1305_tag(nonce, frames))

    def _poly1305_tag(self, nonce: bytes, frames: Sequence[Any]) -> bytes:
        """Poly1305 under a key no one without the secret can derive, used for this nonce only."""
        mac = _poly1305()(self.sign([_ONE_TIME_KEY_LABEL, nonce]))
        for frame in frames:
            mac.update(frame)
        tag: bytes = mac.finalize()
        return tag


def _poly1305() -> Any:
    with require_extra("cryptography (the fast Poly1305 MAC of weight buckets)", "cryptography"):
        from cryptography.hazmat.primitives.poly1305 import Poly1305
    return Poly1305


def check_mac_scheme(scheme: str) -> str:
    """``scheme`` if it is one of ``MAC_SCHEMES``, else ``ConfigError`` naming them."""
    if scheme not in MAC_SCHEMES:
        raise ConfigError(f"unknown message signature {scheme!r}: use one of {', '.join(MAC_SCHEMES)}")
    return scheme
