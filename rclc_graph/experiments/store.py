"""`DIR/results.jsonl`: one appended, fsynced JSON row per finished (case, arm).

The file is the experiment's memory. Rows are only ever appended, each followed by an fsync,
so a crash loses at most the row being written. That row can be left torn (no newline, JSON
cut short); opening the store detects it, drops those bytes (`recovered_bytes` says how
many) and carries on, so a resumed experiment recomputes exactly that one (case, arm). A
complete row that only lacks its newline is kept. Any other malformed line means the file
was edited or damaged; that is an error naming the line, never silently skipped.

A lock file (`DIR/.lock`, `run.directory_lock.DirectoryLock`) keeps two processes from appending to one store at once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from rclc.files import DIRECTORY_MODE, FILE_MODE, require_regular_file, sync_directory

from ..errors import StoreError
from ..run.directory_lock import LOCK_FILE, DirectoryLock
from ..spec.bounded_json import loads

RESULTS = "results.jsonl"

Key = tuple[str, str]  # (case id, arm name)


def _store_busy(directory: Path) -> StoreError:
    return StoreError(
        f"{directory}: another experiment is writing to this directory (lock {LOCK_FILE} is held); "
        "wait for it, or use another --out"
    )


def _unusable(directory: Path, error: OSError) -> StoreError:
    """What is wrong with an --out that cannot hold results, instead of the OSError's traceback
    (a dangling link used to read as "File exists")."""
    shown = str(directory)
    if directory.is_symlink() and not directory.exists():
        reason = f"is a symbolic link to {os.readlink(directory)!r}, which does not exist; create its target or pass another directory"
    elif directory.exists() and not directory.is_dir():
        reason = "is a file, not a directory; pass a directory for the results"
    else:
        reason = f"cannot be created ({error.strerror}); pass another directory"
    return StoreError(f"--out: {shown!r} {reason}")


class ResultStore:
    """Append-only result rows; use as a context manager so the lock is released."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / RESULTS
        self.recovered_bytes = 0
        self._rows: list[dict[str, Any]] = []
        self._lock = DirectoryLock(self.directory, busy=_store_busy)
        self._needs_newline = False
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
        except OSError as error:
            raise _unusable(self.directory, error) from None
        self._lock.acquire()
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    # -- reading ---------------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """Every complete row, in file order (copies: callers cannot alter the store)."""
        return [dict(row) for row in self._rows]

    def latest(self) -> dict[Key, dict[str, Any]]:
        """The last row written for each (case, arm)."""
        return {(row["case"], row["arm"]): dict(row) for row in self._rows}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def __len__(self) -> int:
        return len(self._rows)

    # -- writing ---------------------------------------------------------------------------

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one row and fsync it; the row must name its `case` and `arm`."""
        _check_row(row, "row")
        line = json.dumps(dict(row), ensure_ascii=False, sort_keys=False, allow_nan=False)
        data = (("\n" if self._needs_newline else "") + line + "\n").encode("utf-8")
        created = not self.path.exists()
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)  # rclc.files' rule
        try:
            view = memoryview(data)
            while view:
                written = os.write(descriptor, view)
                view = view[written:]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        if created:
            sync_directory(self.directory)
        self._needs_newline = False
        self._rows.append(json.loads(line))

    def close(self) -> None:
        """Release the store's lock (the context manager does it)."""
        self._lock.release()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _load(self) -> None:
        if not self.path.exists():
            return
        require_regular_file(self.path, RESULTS, follow_links=True)  # a FIFO would block the read forever
        raw = self.path.read_bytes()
        end = len(raw)
        if raw and not raw.endswith(b"\n"):
            cut = raw.rfind(b"\n") + 1
            tail = raw[cut:]
            if _complete_row(tail):
                self._needs_newline = True
            else:
                with open(self.path, "r+b") as handle:  # drop the torn row a crash left behind
                    handle.truncate(cut)
                    handle.flush()
                    os.fsync(handle.fileno())
                self.recovered_bytes = len(tail)
                end = cut
        for number, line in enumerate(raw[:end].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise StoreError(
                    f"{self.path}:{number}: not a JSON row ({exc}); the file was edited or damaged "
                    "(fix or delete that line; rows are only ever appended)"
                ) from None
            _check_row(row, f"{self.path}:{number}")
            self._rows.append(row)


def read_rows(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The complete rows of DIR/results.jsonl without locking or repairing it (a torn last
    row is skipped, not truncated): for reading another experiment's results."""
    path = Path(directory) / RESULTS
    if not path.is_file():
        raise StoreError(f"{path}: no results file (is {directory} an experiment directory?)")
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n") and not _complete_row(raw[raw.rfind(b"\n") + 1:]):
        raw = raw[: raw.rfind(b"\n") + 1]
    rows = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise StoreError(f"{path}:{number}: not a JSON row ({exc})") from None
        _check_row(row, f"{path}:{number}")
        rows.append(row)
    return rows


def _complete_row(tail: bytes) -> bool:
    try:
        row = loads(tail.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(row, dict) and isinstance(row.get("case"), str) and isinstance(row.get("arm"), str)


def _check_row(row: Any, where: str) -> None:
    if not isinstance(row, Mapping):
        raise StoreError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in ("case", "arm"):
        if not isinstance(row.get(key), str) or not row.get(key):
            raise StoreError(f"{where}: field {key!r} must be a non-empty string")
