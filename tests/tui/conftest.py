from __future__ import annotations

from collections.abc import Iterator

import pytest
from tui_controller import TuiController

SECRET = b"rose-tui-test-secret-0123456789abcdef"


@pytest.fixture
def secret() -> bytes:
    return SECRET


@pytest.fixture
def controller() -> Iterator[TuiController]:
    with TuiController(SECRET) as ctl:
        yield ctl
