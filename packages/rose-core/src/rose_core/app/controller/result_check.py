"""What the controller checks in an executor's answer before anything of it is trained on or counted.

An executor holds a key, so its messages are authentic; they can still be wrong (a bug, a broken engine, a stolen
key). A turn's result is refused unless its token ids and logprobs are one-dimensional, of equal non-zero length,
no longer than the turn's ``max_tokens``, its token ids non-negative, its logprobs finite and <= 0, and its
weight version inside the turn's window; its top alternatives, when the turn asked for ``k``, ``(tokens, k)``,
likeliest first. A registration is refused unless its id is a short printable name and
its rollout capacity and memory are within bounds. A refused result is handled as a failure of its turn on that
executor (``invalid_result``: the scheduler never sends the turn there again, and bounds the retries); a refused
registration is told why. Both are counted (``rose_refused_results_total{reason}``,
``rose_rejected_messages_total{reason="bad_registration"}``) and the run goes on.
"""

from __future__ import annotations

import numpy as np

from rose_core.app.controller.job_hooks import TurnPayload
from rose_core.config.executor_config import MAX_ROLLOUT_CAPACITY
from rose_core.protocol.messages import Register, TurnResult
from rose_core.scheduler import TurnTicket

MAX_EXECUTOR_ID = 128
MAX_MODELS = 16


def result_problem(msg: TurnResult, ticket: TurnTicket) -> tuple[str, str]:
    """``(reason, detail)`` of what is wrong with ``msg`` as the result of ``ticket``; ``("", "")`` when nothing."""
    ids, logprobs = msg.output_token_ids, msg.output_logprobs
    if ids.ndim != 1 or logprobs.ndim != 1 or len(ids) != len(logprobs):
        return "shape", f"{ids.shape} token ids for {logprobs.shape} logprobs: one logprob per sampled token"
    if len(ids) == 0:
        return "empty", "no tokens: a turn samples at least one"
    payload = ticket.payload
    if isinstance(payload, TurnPayload) and len(ids) > payload.sampling.max_tokens:
        return "too_long", f"{len(ids)} tokens for max_tokens {payload.sampling.max_tokens}"
    if ids.dtype.kind not in "iu" or bool((ids < 0).any()):
        return "token_ids", f"token ids must be non-negative integers (dtype {ids.dtype})"
    if logprobs.dtype.kind != "f" or not bool(np.isfinite(logprobs).all()) or bool((logprobs > 0).any()):
        return "logprobs", "logprobs must be finite and <= 0"
    if not ticket.min_version <= msg.weight_version <= ticket.max_version:
        return "version", (f"ran on weight version {msg.weight_version}, outside the turn's window "
                           f"[{ticket.min_version}, {ticket.max_version}]")
    k = payload.sampling.top_logprobs if isinstance(payload, TurnPayload) else 0
    return _top_problem(msg, len(ids), k)


def _top_problem(msg: TurnResult, tokens: int, k: int) -> tuple[str, str]:
    """The top alternatives: present exactly when asked for, (tokens, k) ids >= 0 and logprobs <= 0 (-inf allowed:
    outside the top-p nucleus), likeliest first."""
    ids, logprobs = msg.top_token_ids, msg.top_logprobs
    if k == 0:
        return ("top", "top alternatives that were not asked for") if ids is not None or logprobs is not None \
            else ("", "")
    if ids is None or logprobs is None or ids.shape != (tokens, k) or logprobs.shape != (tokens, k):
        shapes = (None if ids is None else ids.shape, None if logprobs is None else logprobs.shape)
        return "top", f"top alternatives of shapes {shapes} for ({tokens}, {k}): {k} per sampled token"
    if ids.dtype.kind not in "iu" or bool((ids < 0).any()):
        return "top", "top token ids must be non-negative integers"
    if logprobs.dtype.kind != "f" or bool(np.isnan(logprobs).any()) or bool((logprobs > 0).any()):
        return "top", "top logprobs must be <= 0 (or -inf)"
    if k > 1 and bool((np.diff(logprobs, axis=1) > 1e-6).any()):
        return "top", "top alternatives must come likeliest first"
    return "", ""


def registration_problem(msg: Register) -> str:
    """What is wrong with a registration, naming the fix; ``""`` when nothing."""
    if not msg.executor_id or len(msg.executor_id) > MAX_EXECUTOR_ID or not msg.executor_id.isprintable():
        return f"executor_id must be 1-{MAX_EXECUTOR_ID} printable characters"
    if not 1 <= msg.rollout_capacity <= MAX_ROLLOUT_CAPACITY:
        return (f"rollout_capacity {msg.rollout_capacity} is outside 1-{MAX_ROLLOUT_CAPACITY}: set "
                "[rollout] capacity in the executor's config")
    if msg.memory_bytes < 0:
        return f"memory_bytes {msg.memory_bytes} is negative"
    if msg.weight_version < -1:
        return f"weight_version {msg.weight_version} is below -1 (-1: none applied yet)"
    if len(msg.models) > MAX_MODELS:
        return f"{len(msg.models)} models: at most {MAX_MODELS}"
    return ""
