"""Argument checks shared by every module, so error messages read the same everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import RclcError


def is_exact_int(value: Any) -> bool:
    """True for a plain Python int: bools, floats and numpy integers are rejected on purpose."""
    return type(value) is int


def require_int(name: str, value: Any, *, minimum: int) -> int:
    """Return `value` when it is an exact int >= minimum, else raise RclcError naming `name`."""
    if not is_exact_int(value) or value < minimum:
        raise RclcError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return value


def optional_int(name: str, value: Any, *, minimum: int) -> int | None:
    """`require_int` for an argument that may also be None."""
    return None if value is None else require_int(name, value, minimum=minimum)


def require_bool(name: str, value: Any) -> bool:
    """Return `value` when it is exactly True or False, else raise RclcError naming `name`."""
    if type(value) is not bool:
        raise RclcError(f"{name}: expected True or False, got {value!r}")
    return value


def require_entries(name: str, value: Any, count: int, *, expected: str, wrong_count: str) -> Sequence[Any]:
    """Return `value` when it is a sequence (not a string) of exactly `count` entries, else raise
    RclcError naming `name`: "{name}: expected {expected}, got <type>" or "{name}: <n> entries
    for {wrong_count}"."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise RclcError(f"{name}: expected {expected}, got {type(value).__name__}")
    if len(value) != count:
        raise RclcError(f"{name}: {len(value)} entries for {wrong_count}")
    return value
