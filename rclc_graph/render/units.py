"""Human-readable sizes, one format for the terminal, report.html and experiment tables, so a
payload reads the same wherever a user meets it."""

from __future__ import annotations


def format_bytes(count: float) -> str:
    """`626 B`, `216.2 KiB`, `2.8 MiB`: binary units, one decimal above a KiB."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"
