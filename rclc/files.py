"""Files that are never torn: write a temporary file, fsync it, rename it over the target, fsync the directory.

A reader (or a crash) sees the old file or the new one, never part of one. The temporary
name sits in the destination's directory so the rename stays on one filesystem; the
directory fsync makes the rename itself survive a power loss. Snapshots, run records and
experiment rows are all written through `write_atomic`.

Permissions, one rule for every file rclc and rclc-graph write (snapshots, run records,
node files, reports, experiment rows and summaries): files are created private to their
owner, mode 0o600 (less the umask), because any of them may hold users' documents, prompts,
outputs or model inputs. Directories that hold them are created 0o700. Share a file by
changing its mode yourself.

Reading goes through `require_regular_file` where a path comes from a directory someone else
may have edited: a FIFO or device in place of a file would block the reader forever, and a
symbolic link would lead it outside the directory.

Plain standard library, no torch: graph planning and recording use it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
from pathlib import Path
from collections.abc import Callable
from typing import Any

from .errors import RclcError

__all__ = [
    "DIRECTORY_MODE",
    "FILE_MODE",
    "file_sha256",
    "remove_interrupted_writes",
    "require_regular_file",
    "sync_directory",
    "write_atomic",
    "write_json_atomic",
]

FILE_MODE = 0o600  # every file written: private to its owner (see the module docstring)
DIRECTORY_MODE = 0o700  # every directory created for such files

# The temporary file `write_atomic` writes beside its destination: `.<name>.<12 hex>.tmp`.
# Only names of exactly this shape are ever removed as leftovers of an interrupted write.
_TEMPORARY_HEX = 6  # bytes of secrets.token_hex: 12 hex digits
_TEMPORARY_NAME = re.compile(r"\..+\.[0-9a-f]{%d}\.tmp" % (2 * _TEMPORARY_HEX), re.DOTALL)


def _temporary_path(destination: Path) -> Path:
    return destination.parent / f".{destination.name}.{secrets.token_hex(_TEMPORARY_HEX)}.tmp"


def remove_interrupted_writes(
    directory: str | os.PathLike[str], *, skip: Callable[[Path], bool] | None = None
) -> list[Path]:
    """Remove the temporary files that interrupted `write_atomic` calls left under `directory`.

    A write killed between creating its temporary and renaming it (SIGKILL, power loss)
    leaves `.<name>.<hex>.tmp` behind; no later write reuses that name, so nothing else
    would ever remove it. Call this only while no other writer can be writing under
    `directory` (rclc-graph calls it when it takes a directory's lock), since an in-flight
    write's temporary looks the same. Only regular files whose name has exactly the shape
    `write_atomic` gives are removed; links are not followed. `skip(subdirectory)` returning
    True leaves a subdirectory (and everything under it) alone. Returns the removed paths.
    """
    removed: list[Path] = []
    for root, directories, files in os.walk(directory, followlinks=False):
        if skip is not None:
            directories[:] = [name for name in directories if not skip(Path(root) / name)]
        for name in files:
            path = Path(root) / name
            if _TEMPORARY_NAME.fullmatch(name) and stat.S_ISREG(os.lstat(path).st_mode):
                try:
                    os.remove(path)
                except FileNotFoundError:
                    continue
                removed.append(path)
    return removed


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """Persist the directory's entries (a rename in it) by fsyncing the directory.

    Best effort: some filesystems refuse a directory fsync, and the rename stays atomic
    without it, so that failure is ignored.
    """
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


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = FILE_MODE) -> None:
    """Replace `path` with `data` atomically, creating missing parent directories (0o700).

    `mode` is the permission the new file is created with, less the process umask (as with
    `open`); the default is the package's rule, private to the owner (0o600). On any
    error the previous file is untouched and no temporary file is left behind; a process
    killed mid-write can leave one, which `remove_interrupted_writes` removes later.
    """
    destination = Path(path)
    directory = destination.parent
    directory.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
    temporary = _temporary_path(destination)
    # os.open (not mkstemp, which forces 0o600) so the umask applies to `mode`.
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, destination)
        sync_directory(directory)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int = 1) -> None:
    """Write strict JSON (no NaN or Infinity: ValueError), UTF-8, `indent` spaces (default one), atomically."""
    text = json.dumps(data, indent=indent, ensure_ascii=False, allow_nan=False, sort_keys=False)
    write_atomic(path, (text + "\n").encode("utf-8"))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def require_regular_file(path: str | os.PathLike[str], what: str = "path", *, follow_links: bool = False) -> None:
    """Raise RclcError (a ValueError) unless `path` is a regular file (not a FIFO, socket, device or
    directory, and not a symbolic link unless `follow_links`); FileNotFoundError when it is
    missing.

    Opened without blocking and checked on the open descriptor, so a FIFO put in place of a
    file cannot hang the caller (opening a FIFO for reading would wait for a writer).
    """
    shown = os.fspath(path)
    if not follow_links and os.path.islink(shown):
        raise RclcError(f"{what}: {shown!r} is a symbolic link; pass the file itself")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    descriptor = os.open(shown, flags)
    try:
        mode = os.fstat(descriptor).st_mode
    finally:
        os.close(descriptor)
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise RclcError(f"{what}: {shown!r} is {kind}; pass a regular file")
