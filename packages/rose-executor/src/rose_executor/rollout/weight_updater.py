"""Applies announced weight versions to the rollout engine: fetch with rose-transfer, then swap in place.

Fetching overlaps with running turns. Applying stops admission, gives in-flight turns back
(``weight_update``), pauses the engine, reloads, resumes and reports ``WeightApplied``. A failed fetch or
apply reports ``ok=False`` and keeps the old version (reloading its bytes if the model was touched).
``WeightApplied`` says where the seconds went: queued, transfer (the fetch), apply (abort, pause, reload,
resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rose_core.errors import RoseError, require_extra
from rose_core.messages import TensorEntry, WeightAnnounce, WeightApplied
from rose_executor import metrics
from rose_executor.engine.engine_protocol import Engine
from rose_executor.engine.weight_file import flat_file_from_safetensors
from rose_executor.rollout.rollout_runner import Reply, RolloutRunner

log = logging.getLogger(__name__)
HeldWeights = tuple[Path, list[TensorEntry]]


@dataclass(slots=True)
class ApplyTimes:
    """Where one ``apply`` went (seconds): ``seconds`` is the whole, from the call to resumed and admitting."""

    seconds: float = 0.0
    abort_s: float = 0.0
    pause_s: float = 0.0
    reload_s: float = 0.0
    resume_s: float = 0.0
    aborted_turns: int = 0


@dataclass(slots=True)
class UpdateTimes:
    """Where one update went (seconds): queued behind the loop, the fetch, the apply."""

    queue_s: float = 0.0
    transfer_s: float = 0.0
    apply: ApplyTimes | None = None


class WeightUpdater:
    """Serialises weight updates of one rollout engine; the newest announcement wins."""

    def __init__(
        self,
        runner: RolloutRunner,
        engine: Engine,
        *,
        executor_id: str,
        secret: bytes,
        stage_dir: Path,
        send: Reply,
        fetch_timeout_s: float = 300.0,
    ) -> None:
        self.runner = runner
        self.engine = engine
        self.executor_id = executor_id
        self.stage_dir = stage_dir
        self.fetch_timeout_s = fetch_timeout_s
        self.updating = False
        self._secret = secret
        self._send = send
        self._fetcher: Any = None
        self._pending: WeightAnnounce | None = None
        self._pending_at = 0.0
        self._wakeup = asyncio.Event()
        self._held: HeldWeights | None = None
        self._task = asyncio.create_task(self._loop(), name="weight-updater")

    def announce(self, msg: WeightAnnounce) -> None:
        if self._pending is None or msg.version > self._pending.version:
            self._pending = msg
            self._pending_at = time.perf_counter()
        self._wakeup.set()

    async def close(self) -> None:
        """Stop updating and delete the staged version file (it lives in memory under /dev/shm)."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._held is not None:
            self._held[0].unlink(missing_ok=True)
            self._held = None
        with contextlib.suppress(OSError):
            self.stage_dir.rmdir()  # only if empty: never remove what others put there

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
            self._reply(announce.version, 0.0, 0, times)
            return
        try:
            received = await self._update(announce, times)
        except TimeoutError:
            seconds = time.perf_counter() - started
            error = f"fetching version {announce.version} from {announce.source} timed out after {seconds:.0f} s"
            log.warning("%s", error)
            self._reply(announce.version, seconds, 0, times, error=error)
            return
        except Exception as exc:
            log.warning("weight version %d not applied: %s", announce.version, exc)
            seconds = time.perf_counter() - started
            self._reply(announce.version, seconds, 0, times, error=str(exc) or type(exc).__name__)
            return
        seconds = time.perf_counter() - started
        metrics.WEIGHT_APPLY_SECONDS.observe(seconds)
        applied = times.apply or ApplyTimes()
        log.info(
            "weight version %d applied in %.2f s (queued %.3f s; fetch %.3f s, %d bytes; apply %.3f s: "
            "abort %.3f s (%d turns), pause %.3f s, reload %.3f s, resume %.3f s)",
            announce.version,
            seconds,
            times.queue_s,
            times.transfer_s,
            received,
            applied.seconds,
            applied.abort_s,
            applied.aborted_turns,
            applied.pause_s,
            applied.reload_s,
            applied.resume_s,
        )
        self._reply(announce.version, seconds, received, times)

    async def _update(self, announce: WeightAnnounce, times: UpdateTimes) -> int:
        """Fetch and apply ``announce``, noting the fetch and apply times in ``times``; returns bytes received."""
        dest = self.stage_dir / f"v{announce.version}.bin"
        started = time.perf_counter()
        try:
            fetched = await asyncio.wait_for(self._fetch(announce, dest), self.fetch_timeout_s)
            if fetched.version != announce.version:
                raise RoseError(f"fetched version {fetched.version} while version {announce.version} was announced")
            times.transfer_s = time.perf_counter() - started
            times.apply = await self.apply(Path(fetched.path), list(fetched.entries), announce.version)
        except BaseException:
            if self._held is None or self._held[0] != dest:
                dest.unlink(missing_ok=True)
            raise
        return int(fetched.bytes_received)

    async def _fetch(self, announce: WeightAnnounce, dest: Path) -> Any:
        if self._fetcher is None:
            with require_extra("rose-transfer's WeightFetcher", "rose-transfer"):
                from rose_transfer import WeightFetcher
            self._fetcher = WeightFetcher(secret=self._secret, receiver_id=self.executor_id)
        return await self._fetcher.fetch(announce, have_version=self.runner.weight_version, dest=dest)

    # ---------------------------------------------------------------- apply in place

    async def apply(self, path: Path, entries: list[TensorEntry], version: int) -> ApplyTimes:
        """Swap the rollout engine to ``version`` (flat file ``path``); returns where the seconds went."""
        times = ApplyTimes()
        started = mark = time.perf_counter()

        def lap() -> float:
            nonlocal mark
            last, mark = mark, time.perf_counter()
            return mark - last

        self.updating = True
        self.runner.refuse("weight_update")
        try:
            times.aborted_turns = await self.runner.abort_all("weight_update")
            times.abort_s = lap()
            await self.engine.pause(clear_cache=True)
            times.pause_s = lap()
            try:
                await self._reload_or_restore(path, entries)
            finally:
                times.reload_s = lap()
                await self.engine.resume()
                times.resume_s = lap()
            self.runner.set_version(version)
            self._replace_held(path, entries)
            return times
        finally:
            self.runner.admit()
            self.updating = False
            times.seconds = time.perf_counter() - started

    async def _reload_or_restore(self, path: Path, entries: list[TensorEntry]) -> float:
        try:
            return await self.engine.reload_weights(path, entries)
        except Exception:
            await self._restore()
            raise

    async def _restore(self) -> None:
        """Put the held version's bytes back after a failed reload left the model half-updated."""
        try:
            held = self._held
            if held is None:
                held = await asyncio.to_thread(self._stage_checkpoint)
            await self.engine.reload_weights(*held)
            self._held = held
        except Exception as exc:
            log.error("could not restore weight version %d after a failed reload: %s", self.runner.weight_version, exc)

    def _stage_checkpoint(self) -> HeldWeights:
        path = self.stage_dir / f"v{self.runner.weight_version}.bin"
        return path, flat_file_from_safetensors(Path(self.engine.spec.model_dir), path)

    def _replace_held(self, path: Path, entries: list[TensorEntry]) -> None:
        old, self._held = self._held, (path, entries)
        if old is not None and old[0] != path:
            old[0].unlink(missing_ok=True)

    def _reply(self, version: int, seconds: float, received: int, times: UpdateTimes, error: str = "") -> None:
        applied = times.apply or ApplyTimes()
        self._send(
            WeightApplied(
                executor_id=self.executor_id,
                version=version,
                seconds=seconds,
                bytes_received=received,
                ok=not error,
                error=error[:500],
                queue_seconds=times.queue_s,
                transfer_seconds=times.transfer_s,
                apply_seconds=applied.seconds,
                abort_seconds=applied.abort_s,
                pause_seconds=applied.pause_s,
                reload_seconds=applied.reload_s,
                resume_seconds=applied.resume_s,
                aborted_turns=applied.aborted_turns,
            )
        )
