"""A stand-in controller for the dashboard's tests and demos: a real ``ControlServer`` that answers an
observer's ``Hello`` with ``Welcome`` and streams ``StatusSnapshot``s to it until it says ``Goodbye``.

Run it by hand to look at the dashboard: ``python tests/tui/tui_controller.py --port 5599`` then
``ROSE_SECRET=... rose-tui --connect tcp://127.0.0.1:5599`` (it prints the exact command).
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from collections.abc import Callable

from rose_core.protocol.messages import (
    ExecutorStatus,
    Goodbye,
    Hello,
    LoadReport,
    StatusAck,
    StatusSnapshot,
    StepStatus,
    Welcome,
)
from rose_core.transport.channel import ControlServer

SLO_TTFT_MS = 250.0
SLO_TPOT_MS = 50.0


def make_snapshot(t: float = 12.0, *, step: int = 4, finished: bool = False) -> StatusSnapshot:
    """A small fleet mid-step: one dedicated executor, two serving ones (the second past its TTFT SLO)."""
    wave = math.sin(t / 3)
    executors = [
        ExecutorStatus(
            executor_id="dedicated-0",
            role="dedicated",
            state="ready",
            weight_version=step - 1,
            load=LoadReport(rollout_in_flight=14, rollout_capacity=16, weight_version=step - 1),
            turns_done=310 + int(t * 3),
            last_seen_s=0.3,
            routed={"dedicated": 200 + int(t * 2), "affinity": 110 + int(t)},
        ),
        ExecutorStatus(
            executor_id="serving-0",
            role="serving",
            state="ready",
            weight_version=step - 1,
            load=LoadReport(
                serving_kv_usage_ratio=0.42 + 0.1 * wave,
                serving_ttft_p99_ms=120.0 + 30 * wave,
                serving_tpot_p99_ms=22.0 + 4 * wave,
                rollout_in_flight=3,
                rollout_capacity=8,
                guard_hold_seconds_total=4.25,
                guard_min_slack_ms=12.5,
                prefix_hit_ratio=0.31,
            ),
            turns_done=95 + int(t),
            last_seen_s=0.6,
            borrowed=True,
            routed={"borrowed": 40, "affinity": 55},
        ),
        ExecutorStatus(
            executor_id="serving-1",
            role="serving",
            state="draining",
            weight_version=step - 2,
            load=LoadReport(
                serving_kv_usage_ratio=0.93,
                serving_ttft_p99_ms=310.0 + 20 * wave,
                serving_tpot_p99_ms=44.0,
                rollout_in_flight=0,
                rollout_capacity=4,
                rollout_budget_frozen=True,
                guard_hold_seconds_total=61.0,
                guard_min_slack_ms=-8.0,
                rollout_held=2,
            ),
            turns_done=12,
            last_seen_s=2.4,
        ),
    ]
    done = min(64, int(t * 2) % 65)
    history = [
        StepStatus(
            step=s,
            phase="done",
            weight_version=s - 1,
            trajectories_total=64,
            trajectories_done=64,
            turns_in_flight=0,
            turns_queued=0,
            reward_mean=0.1 * s,
            success_rate=0.25 * s,
            eval_success=0.5 if s % 2 == 1 else None,
            rollout_seconds=2.0 + 0.5 * s,
            train_seconds=0.6,
            sync_seconds=0.2 + 0.05 * s,
        )
        for s in range(max(0, step - 6), step)
    ]
    return StatusSnapshot(
        controller_id="ctl-test",
        time=t,
        executors=executors,
        step=StepStatus(
            step=step,
            phase="rollout",
            weight_version=step - 1,
            trajectories_total=64,
            trajectories_done=done,
            turns_in_flight=17,
            turns_queued=5,
            reward_mean=0.375,
        ),
        slo_ttft_ms=SLO_TTFT_MS,
        slo_tpot_ms=SLO_TPOT_MS,
        weight_sync_seconds=1.84,
        weight_sync_bytes=367_001_600,
        history=history,
        finished=finished,
        weight_sync_publish_seconds=0.05,
        weight_sync_transfer_seconds=0.41,
        weight_sync_apply_seconds=0.9,
        weight_sync_wait_seconds=0.48,
    )


class TuiController:
    """Plays the controller's side of the observer contract on a real socket."""

    def __init__(
        self,
        secret: bytes,
        address: str = "tcp://127.0.0.1:*",
        interval_s: float = 0.1,
        snapshot: Callable[[float], StatusSnapshot] = make_snapshot,
    ) -> None:
        self.server = ControlServer(address, secret)
        self.address = self.server.address
        self.interval_s = interval_s
        self.snapshot = snapshot
        self.observers: set[bytes] = set()
        self.hellos: list[Hello] = []
        self.goodbyes: list[Goodbye] = []
        self.acks: list[StatusAck] = []
        self.sent = 0
        self.sending = threading.Event()
        self.sending.set()
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tui-controller", daemon=True)
        self._thread.start()

    def pause(self) -> None:
        self.sending.clear()

    def resume(self) -> None:
        self.sending.set()

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self.server.close()

    def __enter__(self) -> TuiController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        next_send = time.monotonic()
        while not self._stop.is_set():
            got = self.server.recv(timeout=0.01)
            if got is not None:
                self._handle(*got)
            if time.monotonic() >= next_send:
                next_send += self.interval_s
                if self.sending.is_set():
                    snapshot = self.snapshot(time.monotonic() - self._started)
                    for peer in list(self.observers):
                        self.server.send(peer, snapshot)
                        self.sent += 1

    def _handle(self, peer: bytes, msg: object) -> None:
        if isinstance(msg, Hello):
            self.hellos.append(msg)
            self.observers.add(peer)
            self.server.send(peer, Welcome(controller_id="ctl-test"))
        elif isinstance(msg, StatusAck):
            self.acks.append(msg)
        elif isinstance(msg, Goodbye):
            self.goodbyes.append(msg)
            self.observers.discard(peer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=5599)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--secret", default="rose-tui-demo-secret-0123456789")
    args = parser.parse_args()
    controller = TuiController(args.secret.encode(), f"tcp://127.0.0.1:{args.port}", args.interval)
    print(f"ROSE_SECRET={args.secret} rose-tui --connect {controller.address}", flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        controller.close()


if __name__ == "__main__":
    main()
