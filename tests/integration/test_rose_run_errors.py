"""`rose run` failure paths that a newcomer meets: one clear line, exit 2, nothing left running."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def test_busy_controller_port_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "rose.toml"
    config.write_text(f'models_dir = "{tmp_path / "models"}"\nrun_dir = "{tmp_path / "run"}"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "rose_core", "run", "--config", str(config), "--port", str(port)],
            capture_output=True, text=True, timeout=600, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("rose: error:")]
    assert len(errors) == 1 and "pick a free port" in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert not list((tmp_path / "run").glob("logs/*.log")), "no executor should have been started"
