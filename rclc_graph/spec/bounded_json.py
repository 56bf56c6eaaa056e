"""JSON read with the same guards as YAML: bounded nesting, no duplicate keys.

Python's `json` recurses once per nesting level, so a 2000-deep document raises
RecursionError (and anything later that walks the value recursively, such as `repr` or
pydantic, may too); and a key given twice silently keeps the last value. Every JSON file the
graph layer reads (run inputs, run records, node files, datasets) goes through `loads`: a
document nested deeper than `MAX_DEPTH` or with a repeated key is refused with a ValueError
that says where.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import JSONLimitError
from .safe_yaml import MAX_DEPTH

__all__ = ["JSONLimitError", "depth", "loads", "plain"]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise JSONLimitError(f"key {key!r} appears twice in one object")
        result[key] = value
    return result


def depth(value: Any) -> int:
    """Nesting depth of lists and objects in a parsed value (iterative: any depth is safe)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item)
    return deepest


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads`, refusing duplicate keys and nesting deeper than `max_depth`.

    json.JSONDecodeError (a ValueError) for malformed JSON; JSONLimitError for valid JSON that
    breaks a limit."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError:  # json's scanner guards its own recursion; nothing else ran
        raise JSONLimitError(f"values nested more than {max_depth} levels deep") from None
    if depth(value) > max_depth:
        raise JSONLimitError(f"values nested more than {max_depth} levels deep")
    return value


def plain(value: Any) -> Any:
    """`value` as `json` writes it back: any mapping a dict, tuples lists (so a frozen
    mapping or a tuple compares equal to the same value read from a file)."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value
