"""The embedded demo's tiny models for the bench, generated once by rose-core's `rose models` command.

The executor does not import the application (the import contracts forbid it): it asks for the models the way
`rose run` asks for an executor, by starting the other side's command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rose_core.support.errors import RoseError


def demo_models(models_dir: Path) -> tuple[Path, Path]:
    """``(policy, serving)`` model directories under ``models_dir``; generated there first when missing (needs
    ``rose-core[train]``: torch, transformers)."""
    policy, serving = models_dir / "policy", models_dir / "serving"
    if not (policy / "config.json").is_file() or not (serving / "config.json").is_file():
        done = subprocess.run([sys.executable, "-m", "rose_core", "models", str(models_dir)], check=False)
        if done.returncode != 0:
            raise RoseError(f"could not generate the demo's models in {models_dir} (`rose models` exited "
                            f"{done.returncode}): install rose-core[train], or pass --models-dir with a policy/ "
                            "and a serving/ model directory")
    return policy, serving
