"""Files that are never torn: write to a temporary name, flush, fsync, rename, fsync the directory.

A reader (or a crash) sees the old file or the new one, never part of one. The temporary
name sits in the destination's directory so the rename stays on one filesystem.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any


def sync_directory(directory: Path) -> None:
    """Persist a rename by fsyncing its directory (best effort: some filesystems refuse it,
    and the rename stays atomic). rclc has its twin in rclc/_fsync.py; importing that from
    here would import torch, and planning must stay torch-free (test_planning_imports_no_torch)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` via a temporary file in the same directory, fsync, rename."""
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    temporary = str(destination.parent / f".{destination.name}.{secrets.token_hex(6)}.tmp")
    # os.open with 0o666 lets the umask decide the mode (mkstemp would force 0o600).
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, destination)
        sync_directory(destination.parent)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Strict JSON (no NaN/Infinity), UTF-8, atomically replaced."""
    text = json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False, sort_keys=False)
    write_atomic(path, (text + "\n").encode("utf-8"))


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class DirectoryLock:
    """An exclusive, non-blocking advisory lock on a directory, held while a run writes it.

    Two processes writing one run directory (a run still going and a resume of it, or two
    resumes) would record some nodes twice. The lock is an flock on the directory itself,
    so it adds no file, and the kernel drops it when its holder dies (a SIGKILLed run
    leaves its directory free to resume). Where flock is missing it is a no-op.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._descriptor: int | None = None

    @property
    def held(self) -> bool:
        return self._descriptor is not None

    def acquire(self) -> None:
        if self._descriptor is not None:
            return
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX
            return
        descriptor = os.open(self.directory, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise ValueError(
                f"run_dir: {str(self.directory)!r} is being written by another process (a run or a resume of it); "
                "wait for it to end, or stop it first"
            ) from None
        except BaseException:
            os.close(descriptor)
            raise
        self._descriptor = descriptor

    def release(self) -> None:
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            os.close(descriptor)  # closing the descriptor drops the flock
