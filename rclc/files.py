"""Files that are never torn: write a temporary file, fsync it, rename it over the target, fsync the directory.

A reader (or a crash) sees the old file or the new one, never part of one. The temporary
name sits in the destination's directory so the rename stays on one filesystem; the
directory fsync makes the rename itself survive a power loss. Snapshots, run records and
experiment rows are all written through `write_atomic`.

Plain standard library, no torch: graph planning and recording use it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

__all__ = ["file_sha256", "sync_directory", "write_atomic", "write_json_atomic"]


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


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o666) -> None:
    """Replace `path` with `data` atomically, creating missing parent directories.

    `mode` is the permission the new file is created with, less the process umask (as with
    `open`): the default lets the umask decide, `0o600` keeps a file private. On any
    error the previous file is untouched and no temporary file is left behind.
    """
    destination = Path(path)
    directory = destination.parent
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{destination.name}.{secrets.token_hex(6)}.tmp"
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
