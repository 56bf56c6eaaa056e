"""`--out` checked before anything loads: a directory that exists or can be created.

A run writes `OUT/<run_id>/`. A mistake in OUT used to show up only after the models had
loaded (minutes), and a dangling symbolic link read as "already exists". Here OUT must be a
directory, a symbolic link to one, or a path whose nearest existing parent is a writable
directory; anything else is refused with what it is and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError


def check_out_dir(out: Path, option: str = "--out") -> None:
    """ValueError naming `option` when `out` cannot receive run directories."""
    shown = str(out)
    if out.is_symlink() and not out.exists():
        raise UsageError(
            f"{option}: {shown!r} is a symbolic link to {os.readlink(out)!r}, which does not exist; "
            "create its target or pass another directory"
        )
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"{option}: {shown!r} is a file, not a directory; pass a directory for the runs")
        if not os.access(out, os.W_OK | os.X_OK):
            raise UsageError(f"{option}: cannot write into {shown!r} (permission denied); pass a writable directory")
        return
    parent = out.absolute().parent
    while not parent.exists():
        if parent.is_symlink():
            raise UsageError(f"{option}: {str(parent)!r} is a dangling symbolic link; fix it or pass another path")
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{option}: {str(parent)!r} is a file, so {shown!r} cannot be created; pass another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option}: cannot create {shown!r} in {str(parent)!r} (permission denied)")
