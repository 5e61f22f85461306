"""A picture of the whole dashboard (pytest-textual-snapshot). Update with ``--snapshot-update``."""

from __future__ import annotations

from typing import Any

import pytest
from textual.pilot import Pilot
from tui_controller import make_snapshot

from rose_tui.app import RoseTui
from rose_tui.feed_events import StatusReceived


@pytest.fixture
def snap(request: pytest.FixtureRequest) -> Any:
    """``snap_compare`` of pytest-textual-snapshot (a test dependency of the tui session)."""
    return request.getfixturevalue("snap_compare")


def frozen_app() -> RoseTui:
    return RoseTui(clock=lambda: 1000.0)


async def feed_two_snapshots(pilot: Pilot[Any]) -> None:
    for t in (11.5, 12.0):
        pilot.app.post_message(StatusReceived(make_snapshot(t=t, step=4)))
    await pilot.pause()


@pytest.mark.parametrize("size", [(120, 35), (80, 24)], ids=["120x35", "80x24"])
def test_dashboard_picture(snap: Any, size: tuple[int, int]) -> None:
    assert snap(frozen_app(), terminal_size=size, run_before=feed_two_snapshots)
