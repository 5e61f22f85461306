"""A call into an engine that may hang, bounded: the one place the executor turns "it never returned" into an
error it can act on (a SIGSTOPped or wedged vLLM engine core answers nothing, and an ``await`` on it would
freeze whoever made the call: the SLO guard's loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from rose_core.support.errors import RoseError

T = TypeVar("T")


class EngineHung(RoseError):
    """An engine did not answer a call in time; the message says which call and the setting that bounds it."""


async def bounded(call: Awaitable[T], seconds: float, what: str) -> T:
    """``call``'s result, or ``EngineHung`` once it has not returned after ``seconds`` (``call`` is cancelled)."""
    try:
        async with asyncio.timeout(seconds):
            return await call
    except TimeoutError:
        raise EngineHung(f"the rollout engine did not {what} within {seconds:g} s (rollout.call_timeout_s): "
                         "it hangs") from None
