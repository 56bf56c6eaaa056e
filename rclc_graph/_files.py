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


def _sync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems refuse directory fsync; the rename is still atomic
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
        _sync_directory(destination.parent)
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
