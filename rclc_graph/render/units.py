"""Human-readable sizes and durations, one format for the terminal, report.html and experiment
tables, so a payload or a timing reads the same wherever a user meets it."""

from __future__ import annotations


def format_bytes(count: float) -> str:
    """`626 B`, `216.2 KiB`, `2.8 MiB`: binary units, one decimal above a KiB."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"


def format_seconds(value: float | None, *, decimals: int = 2, missing: str = "–") -> str:
    """`12 ms` below a second, else `1.25 s` (`decimals` places); `missing` for no value.

    The HTML report shows two decimals and a dash for a missing time; the terminal's narrow
    columns show one decimal and leave the cell blank."""
    if value is None:
        return missing
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.{decimals}f} s"


def format_duration(seconds: float) -> str:
    """`45 s`, `3 min 05 s`, `1 h 02 min`: a wall-clock span for progress lines."""
    whole = max(0, int(round(seconds)))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"
