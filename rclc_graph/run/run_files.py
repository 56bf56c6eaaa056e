"""Reading a run directory safely: every path inside it, no symbolic links, regular files only.

A run directory is data that someone may have edited, copied from elsewhere, or tampered
with. Readers here hold three rules, so an edited directory cannot make rclc-graph read or
write outside it, or hang:

- names from files (a node JSON's `snapshot.file`) are plain file names, exactly the one the
  format gives that node; a path such as `../../outside/x.safetensors` is refused;
- `nodes/`, `record.json`, node files, snapshots and `.lock` must not be symbolic links (a
  linked `nodes/` would have let a resume write its node files elsewhere);
- only regular files are opened: a FIFO in place of a node file would block the reader
  forever (`rclc.files.require_regular_file` opens without blocking to check).

JSON is read with the graph's limits (spec/bounded_json.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rclc.files import require_regular_file

from ..spec.bounded_json import loads
from ..errors import UsageError


def check_tree(run_dir: Path, nodes_dir: str) -> None:
    """ValueError when the run directory's `nodes/` is a symbolic link or not a directory."""
    nodes = run_dir / nodes_dir
    if nodes.is_symlink():
        raise UsageError(
            f"run_dir: {str(nodes)!r} is a symbolic link; a run directory holds its node files itself "
            "(replace the link by the directory it points to)"
        )
    if nodes.exists() and not nodes.is_dir():
        raise UsageError(f"run_dir: {str(nodes)!r} is not a directory; the run directory is damaged")


def member(directory: Path, name: Any, expected: str) -> Path:
    """`directory / name` when `name` is exactly `expected` (a plain file name), else ValueError."""
    if not isinstance(name, str) or name != expected or os.sep in name or "/" in name or name in (".", ".."):
        raise UsageError(f"names file {name!r}, not {expected!r}: every file of a node lives next to its JSON")
    return directory / name


def regular(path: Path, what: str) -> None:
    """ValueError unless `path` is a regular file and no symbolic link (FileNotFoundError if missing)."""
    require_regular_file(path, what)


def read_json(path: Path, what: str) -> Any:
    """A run directory's JSON file, refusing links, FIFOs, deep nesting and duplicate keys."""
    regular(path, what)
    with open(path, "rb") as stream:
        raw = stream.read()
    try:
        return loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise UsageError(f"{what}: {str(path)!r} is not UTF-8 ({error.reason})") from None
