"""Fixtures of the core tests."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rose_core.transport.channel import ControlServer

PLUGIN_MODULES = ("lake_plugin", "lake_plugin_broken")
ENTRY_POINTS = """\
[rose.environments]
corridor = lake_plugin:make_corridor
not_callable = lake_plugin:NOT_A_FACTORY
broken = lake_plugin_broken:make_broken
frozenlake = lake_plugin:make_corridor
"""


@pytest.fixture
def lake_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installed distribution ``lake_plugin`` 0.1 (a dist-info folder on ``sys.path``) with four
    ``rose.environments`` entry points: ``corridor`` (``corridor_env.py``, copied in as the module
    ``lake_plugin``), ``not_callable``, ``broken`` (its module fails to import) and ``frozenlake`` (tries to
    shadow the built-in)."""
    info = tmp_path / "lake_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lake_plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    shutil.copy(Path(__file__).with_name("corridor_env.py"), tmp_path / "lake_plugin.py")
    (tmp_path / "lake_plugin_broken.py").write_text("import a_module_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in PLUGIN_MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def server() -> Iterator[ControlServer]:
    """A real ``ControlServer`` on a free loopback port (the ZMQ channel's tests; the in-process twin's
    tests have their own)."""
    from control_frames import SECRET

    srv = ControlServer("tcp://127.0.0.1:0", SECRET)
    yield srv
    srv.close()
