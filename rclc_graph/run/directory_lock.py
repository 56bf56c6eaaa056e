"""Directories that only one process writes at a time: `DirectoryLock`, the `filelock`
library's lock on `DIR/.lock`.

Run directories (a run, or a resume of it) and experiment stores (rows appended to one
results file) are each written by one process; the lock is how a second one is refused.
Files themselves are written atomically by `rclc.files`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import filelock

from rclc.files import FILE_MODE, remove_interrupted_writes

from ..errors import UsageError

LOCK_FILE = ".lock"


def _has_own_lock(subdirectory: Path) -> bool:
    return os.path.lexists(subdirectory / LOCK_FILE)


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

    Taking the lock proves no other process writes the directory, so `acquire` also removes
    the temporaries of atomic writes that a killed holder left (`rclc.files.remove_interrupted_writes`),
    except under subdirectories with a lock of their own (another writer's domain).
    """

    def __init__(self, directory: str | os.PathLike[str], *, busy: Callable[[Path], Exception] = _run_dir_busy) -> None:
        self.directory = Path(directory)
        self._busy = busy
        # thread_local=False: released from the worker thread that finishes a record.
        # preserve_lock_file: the file stays, so a refused resume leaves the directory as it was.
        # mode: private, as every file we write (rclc.files)
        self._lock = filelock.FileLock(self.directory / LOCK_FILE, thread_local=False, preserve_lock_file=True,
                                       mode=FILE_MODE)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._lock.is_locked

    def acquire(self) -> None:
        """Take the lock, or raise `busy(directory)` when another holder has it."""
        if self._lock.is_locked:
            return
        lock_file = self.directory / LOCK_FILE
        if lock_file.is_symlink():  # opening it would truncate whatever it points to
            raise UsageError(f"run_dir: {str(lock_file)!r} is a symbolic link; remove it (it is an empty lock file)")
        try:
            self._lock.acquire(blocking=False)
        except filelock.Timeout:
            raise self._busy(self.directory) from None
        remove_interrupted_writes(self.directory, skip=_has_own_lock)

    def writer_alive(self) -> bool:
        """Whether another process holds the lock now (a run or resume still writing). Read-only
        callers use it: it takes the lock for an instant only when the lock file exists."""
        lock_file = self.directory / LOCK_FILE
        if self._lock.is_locked or not lock_file.is_file() or lock_file.is_symlink():
            return False
        try:
            self._lock.acquire(blocking=False)
        except filelock.Timeout:
            return True
        self._lock.release(force=True)
        return False

    def release(self) -> None:
        """Let the lock go (nothing happens when this object does not hold it)."""
        if self._lock.is_locked:
            self._lock.release(force=True)
