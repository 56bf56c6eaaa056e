"""Text that is safe to print on a terminal: no control sequence reaches it raw.

Descriptions, node names, prompts and generated text come from users, documents and models.
Printed as is, an escape sequence in any of them (`\\x1b]0;title\\x07`, `\\x1b[2J`) would
retitle the window, clear the screen or rewrite what was printed before; a carriage return
or a bidirectional override (U+202E) would make a line read differently from what it holds.
`printable` shows every such character as its escape (`\\x1b`, `\\u202e`) instead, and keeps
newlines and tabs. The CLI passes every string it did not write itself through it.
"""

from __future__ import annotations

from typing import Any

_CONTROLS = (
    [code for code in range(0x00, 0x20) if code not in (0x09, 0x0A)]  # C0, but tab and newline
    + [0x7F]
    + list(range(0x80, 0xA0))  # C1: 0x9b is a one-byte CSI on some terminals
    + [0x061C, 0x200E, 0x200F]  # direction marks
    + list(range(0x202A, 0x202F))  # embeddings and overrides
    + list(range(0x2066, 0x206A))  # isolates
)
_TABLE = {code: (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}") for code in _CONTROLS}


def printable(text: Any) -> str:
    """`str(text)` with control characters (but newline and tab) written as escapes."""
    return str(text).translate(_TABLE)


def printable_line(text: Any) -> str:
    """`printable`, on one line: newlines and tabs become spaces too."""
    return " ".join(printable(text).split())


def printable_data(value: Any) -> Any:
    """A copy of JSON-like data with every string (keys too) made `printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(key) if isinstance(key, str) else key: printable_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_data(item) for item in value]
    return value
