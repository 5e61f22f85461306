"""Making a rename durable: after ``os.replace`` the new name lives in the directory, which is written back on
its own schedule; ``fsync_dir`` forces it, so a crash after it returns cannot bring back the old name.
(Shared by the checkpoint folders and rose-transfer's fetched files.)"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path`` (its entries: names created, renamed or removed in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
