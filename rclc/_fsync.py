"""Make a rename durable: fsync the directory that holds it.

Atomic writes (snapshots, run records, experiment rows) write a temporary file, fsync it and
rename it into place; the rename itself only survives a power loss once the directory entry
is on disk. rclc_graph keeps a twin in rclc_graph/_files.py, because importing anything under
rclc imports torch and graph planning must stay torch-free."""

from __future__ import annotations

import os
from pathlib import Path


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """Persist the directory's entries (best effort: some filesystems refuse directory fsync,
    and the rename stays atomic without it)."""
    try:
        descriptor = os.open(Path(directory), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
