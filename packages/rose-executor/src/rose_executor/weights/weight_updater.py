"""Applies announced weight versions to the rollout engine in place: stage in the engine, drain, commit.

An announce starts the pull inside the engine's workers at once (``Engine.stage_weights``: patches
against the version they hold, O(changes)); the engine keeps stepping. New turns are refused and the
running ones finish on the weights they started on (bounded by the drain timeout; stragglers are given
back as ``weight_update``), then the engine commits the version between two steps: patched in place,
every bucket checked, whole or not at all. The engine is never paused or reloaded. A failed pull or
commit reports ``ok=False`` and the engine keeps its version bit for bit. ``WeightApplied`` says where
the seconds went and carries the digest of what the engine now holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from rose_core.protocol.messages import WeightAnnounce, WeightApplied
from rose_core.support.errors import RoseError
from rose_executor import metrics
from rose_executor.engine.engine_protocol import Engine, WeightCommit, WeightOrder
from rose_executor.rollout.engine_memory import EngineMemory
from rose_executor.rollout.rollout_runner import Reply, RolloutRunner

log = logging.getLogger(__name__)


@dataclass(slots=True)
class UpdateTimes:
    """Where one update went (seconds): queued behind the loop, the drain, the apply, the engine's parts."""

    queue_s: float = 0.0
    stage_call_s: float = 0.0
    """The call that starts the pull in the engine (an RPC to its workers)."""
    drain_s: float = 0.0
    aborted_turns: int = 0
    apply_s: float = 0.0
    commit: WeightCommit | None = None


class WeightUpdater:
    """Serialises weight updates of one rollout engine; the newest announcement wins."""

    def __init__(
        self,
        runner: RolloutRunner,
        engine: Engine,
        *,
        executor_id: str,
        secret: bytes,
        send: Reply,
        fetch_timeout_s: float = 300.0,
        drain_timeout_s: float = 30.0,
        relay: str = "",
        engine_memory: EngineMemory | None = None,
    ) -> None:
        """``engine_memory``: the engine's memory, shared with the co-serving guard on a serving host (held
        restored while an update stages and commits); default: the updater's own."""
        self.runner = runner
        self.engine = engine
        self.executor_id = executor_id
        self.fetch_timeout_s = fetch_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.relay = relay
        self.updating = False
        self.spoiled = False
        """A commit went in but did not end right (a digest or prefix cache it cannot vouch for): the runner
        keeps refusing turns."""
        self.touched = False
        """A version was staged into the engine (its weights may no longer be the policy's own)."""
        self.engine_memory = engine_memory or EngineMemory(engine)
        self._secret = secret
        self._send = send
        self._pending: WeightAnnounce | None = None
        self._pending_at = 0.0
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="weight-updater")

    def announce(self, msg: WeightAnnounce) -> None:
        if self._pending is None or msg.version > self._pending.version:
            self._pending = msg
            self._pending_at = time.perf_counter()
        self._wakeup.set()

    async def close(self) -> None:
        """Stop updating (a version staged and not committed is dropped with the engine)."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    # ---------------------------------------------------------------- the update loop

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            announce, self._pending = self._pending, None
            if announce is not None:
                await self._handle(announce, self._pending_at)

    async def _handle(self, announce: WeightAnnounce, announced_at: float) -> None:
        started = time.perf_counter()
        times = UpdateTimes(queue_s=max(0.0, started - announced_at))
        if announce.version == self.runner.weight_version:
            self._reply(announce.version, 0.0, times)
            return
        try:
            await asyncio.wait_for(self._update(announce, times), self.fetch_timeout_s)
        except TimeoutError:
            seconds = time.perf_counter() - started
            error = f"weight version {announce.version} from {announce.source} not applied within {seconds:.0f} s"
            await self._discard()
            log.warning("%s", error)
            self._reply(announce.version, seconds, times, error=error)
            return
        except Exception as exc:
            await self._discard()
            error = ("the rollout engine died: " if self.engine.errored else "") + (str(exc) or type(exc).__name__)
            log.warning("weight version %d not applied: %s", announce.version, error)
            self._reply(announce.version, time.perf_counter() - started, times, error=error)
            return
        seconds = time.perf_counter() - started
        metrics.WEIGHT_APPLY_SECONDS.observe(seconds)
        self._log_applied(announce.version, seconds, times)
        self._reply(announce.version, seconds, times)

    async def _update(self, announce: WeightAnnounce, times: UpdateTimes) -> None:
        """Stage ``announce`` in the engine, let running turns finish, commit; notes the times."""
        self.updating = self.touched = True
        try:
            async with self.engine_memory.hold():  # restored first, and not released until committed
                await self._stage_and_commit(announce, times)
        finally:
            if not self.spoiled:  # a spoiled engine takes no turn again: its job takes it out (a failed apply)
                self.runner.admit()
            self.updating = False

    async def _stage_and_commit(self, announce: WeightAnnounce, times: UpdateTimes) -> None:
        """Start the pull in the engine, refuse new turns and let running ones finish, commit the version."""
        mark = time.perf_counter()
        relay = announce.relay or self.relay
        await self.engine.stage_weights(WeightOrder(announce, self._secret, self.executor_id, relay))
        times.stage_call_s = time.perf_counter() - mark
        self.runner.refuse("weight_update")
        mark = time.perf_counter()
        times.aborted_turns = await self.runner.drain(self.drain_timeout_s, "weight_update")
        times.drain_s = time.perf_counter() - mark
        mark = time.perf_counter()
        commit = await self.engine.commit_weights(announce.version, self.fetch_timeout_s)
        # apply: the part of the commit call after the pull finished (the pull overlaps the rest)
        times.apply_s = max(0.0, time.perf_counter() - max(mark, commit.pulled_at))
        times.commit = commit
        self.spoiled = True  # from here a failure leaves weights or KV in the engine that nobody vouches for
        if commit.version != announce.version:
            raise RoseError(f"the engine committed version {commit.version}, not {announce.version}")
        self.runner.set_version(announce.version)
        if commit.digest != announce.manifest_digest:
            raise RoseError(
                f"weight version {announce.version}: the engine holds digest {commit.digest}, the trainer "
                f"published {announce.manifest_digest} (a bug: report it with this executor's log)"
            )
        if not await self.engine.reset_prefix_cache():
            raise RoseError(
                f"weight version {announce.version} is applied, but the engine could not drop its prefix cache "
                "(KV blocks of the old weights in use): it takes no more turns (a fresh engine will)"
            )
        self.spoiled = False

    async def _discard(self) -> None:
        try:
            await self.engine.discard_weights()
        except Exception as exc:  # the engine may be gone; the next announce stages afresh anyway
            log.debug("could not discard a staged weight version: %s", exc)

    def _log_applied(self, version: int, seconds: float, times: UpdateTimes) -> None:
        commit = times.commit or WeightCommit(version)
        log.info(
            "weight version %d applied in %.3f s (queued %.3f s; stage call %.3f s; pull %.3f s, %d bytes%s; "
            "drain %.3f s, %d turns given back; apply %.3f s: commit %.3f s, retransform %.3f s, %d tensors changed)",
            version, seconds, times.queue_s, times.stage_call_s, commit.stage_s, commit.bytes_received,
            ", full sync" if commit.full_sync else "", times.drain_s, times.aborted_turns, times.apply_s,
            commit.commit_s, commit.retransform_s, commit.tensors_changed,
        )

    def _reply(self, version: int, seconds: float, times: UpdateTimes, error: str = "") -> None:
        commit = times.commit or WeightCommit(version)
        self._send(
            WeightApplied(
                executor_id=self.executor_id,
                version=version,
                seconds=seconds,
                bytes_received=commit.bytes_received,
                ok=not error,
                error=error[:500],
                queue_seconds=times.queue_s,
                transfer_seconds=commit.stage_s,
                apply_seconds=times.apply_s,
                aborted_turns=times.aborted_turns,
                drain_seconds=times.drain_s,
                commit_seconds=commit.commit_s,
                retransform_seconds=commit.retransform_s,
                full_sync=commit.full_sync,
                tensors_changed=commit.tensors_changed,
                weights_digest=commit.digest,
            )
        )
