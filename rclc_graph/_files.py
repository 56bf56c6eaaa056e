"""Files that are never torn, and directories that only one process writes at a time.

Every file the graph layer writes goes through `write_atomic`: write to a temporary name in
the destination's directory (so the rename stays on one filesystem), flush, fsync, rename,
fsync the directory. A reader (or a crash) sees the old file or the new one, never part of
one. Phase 2 of issue 12 points `write_atomic` at rclc's own implementation (rclc.files);
until then rclc has its twin in rclc/_fsync.py, and importing that from here would import
torch, which planning must not (test_planning_imports_no_torch).

`DirectoryLock` is the `filelock` library's lock on `DIR/.lock`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any, Callable

import filelock

LOCK_FILE = ".lock"


def sync_directory(directory: Path) -> None:
    """Persist a rename by fsyncing its directory (best effort: some filesystems refuse it,
    and the rename stays atomic)."""
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


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """`text` as UTF-8, atomically replaced."""
    write_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int = 1) -> None:
    """Strict JSON (no NaN/Infinity), UTF-8, atomically replaced."""
    text = json.dumps(data, indent=indent, ensure_ascii=False, allow_nan=False, sort_keys=False)
    write_text_atomic(path, text + "\n")


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run_dir_busy(directory: Path) -> Exception:
    return ValueError(
        f"run_dir: {str(directory)!r} is being written by another process (a run or a resume of it); "
        "wait for it to end, or stop it first"
    )


class DirectoryLock:
    """An exclusive, non-blocking lock on a directory (`DIR/.lock`), held while one process writes it.

    Two processes writing one run directory (a run still going and a resume of it, or two
    resumes) would record some nodes twice; two experiments appending to one results file
    would interleave rows. The lock is an OS lock on the lock file (flock on POSIX), so the
    kernel drops it when its holder dies: a SIGKILLed run leaves its directory free to resume.
    `acquire` raises `busy(directory)` (a ValueError naming the run directory by default)
    when another holder has it, and does nothing when this object holds it already;
    `release` may run on another thread than `acquire` (records finish in a worker thread).
    """

    def __init__(self, directory: str | os.PathLike[str], *, busy: Callable[[Path], Exception] = _run_dir_busy) -> None:
        self.directory = Path(directory)
        self._busy = busy
        # thread_local=False: released from the worker thread that finishes a record.
        # preserve_lock_file: the file stays, so a refused resume leaves the directory as it was.
        self._lock = filelock.FileLock(self.directory / LOCK_FILE, thread_local=False, preserve_lock_file=True)

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def acquire(self) -> None:
        if self._lock.is_locked:
            return
        try:
            self._lock.acquire(blocking=False)
        except filelock.Timeout:
            raise self._busy(self.directory) from None

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)
