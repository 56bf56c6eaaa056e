"""The rich consoles every command prints through: one place decides width and wrapping.

A terminal gets rich's defaults (its own width, or `COLUMNS`; long lines wrap at the edge,
as a person reading it expects). Anything else (a log file, a pipe into another program)
gets lines that are never hard-wrapped, whatever `COLUMNS` says: a message broken at a
width that depends on, say, a temporary path's length cannot be searched or parsed, and
breaks the line a user greps for. Tables are drawn there at `COLUMNS` when it is set, else
at a fixed width (`LOG_WIDTH`), so they stay readable.
"""

from __future__ import annotations

import os

from rich.console import Console

LOG_WIDTH = 120  # columns tables are drawn at when the stream is not a terminal


def command_console(*, stderr: bool = False, min_width: int = 0) -> Console:
    """A console on stdout (results) or stderr (errors, notices, progress). `min_width`: the
    width a table needs, for consoles that print one."""
    console = Console(stderr=stderr, highlight=False)
    if console.is_terminal:
        if console.width < min_width:
            console = Console(stderr=stderr, highlight=False, width=min_width)
        return console
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isascii() and columns.isdigit() and 0 < int(columns) < 10_000 else LOG_WIDTH
    return Console(stderr=stderr, highlight=False, width=max(width, min_width), soft_wrap=True)
