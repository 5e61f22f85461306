"""``ucx://HOST:PORT`` sources (parsing only: importing this needs no ucxx)."""

from __future__ import annotations

from rose_core.support.errors import RoseError

UCX_SCHEME = "ucx://"


def parse_ucx_source(source: str) -> tuple[str, int]:
    host, _, port = source.removeprefix(UCX_SCHEME).rpartition(":")
    if not source.startswith(UCX_SCHEME) or not host or not port.isdigit():
        raise RoseError(f"weight source {source!r} is not ucx://HOST:PORT: fix the advertised address")
    return host, int(port)
