"""The rich consoles every command prints through: one place decides width and wrapping.

A terminal gets rich's defaults (its own width; long lines wrap at the edge, as a person
reading it expects). Anything else (a log file, a pipe into another program) gets lines
that are never hard-wrapped: a message broken at a width that depends on, say, a
temporary path's length cannot be searched or parsed, and breaks the line a user greps
for. Tables still render at a fixed width there (`LOG_WIDTH`), so they stay readable.
An explicit `COLUMNS` is honoured either way.
"""

from __future__ import annotations

import os

from rich.console import Console

LOG_WIDTH = 120  # columns tables are drawn at when the stream is not a terminal


def command_console(*, stderr: bool = False, min_width: int = 0) -> Console:
    """A console on stdout (results) or stderr (errors, notices, progress). `min_width`: the
    width a table needs, for consoles that print one."""
    console = Console(stderr=stderr, highlight=False)
    if console.is_terminal or "COLUMNS" in os.environ:
        if console.width < min_width:
            console = Console(stderr=stderr, highlight=False, width=min_width)
        return console
    return Console(stderr=stderr, highlight=False, width=max(LOG_WIDTH, min_width), soft_wrap=True)
