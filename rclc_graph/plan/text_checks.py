"""Every text of a spec must be valid Unicode: no lone surrogates.

A lone surrogate (half of a UTF-16 pair, e.g. from the YAML escape "\\ud800" or a Python
string built from one) passes every type check, then fails with a UnicodeEncodeError when
the run writes its record, after the models loaded and with an empty run directory. The YAML
reader refuses them with their line (spec/safe_yaml.py); this check covers specs built in
Python (the builder, `GraphSpec(...)`) the same way, with the field's path.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..errors import FieldPath, Problem
from ..spec.models import GraphSpec
from ..spec.safe_yaml import has_surrogate


def _texts(value: Any, path: FieldPath) -> Iterator[tuple[FieldPath, str]]:
    stack: list[tuple[Any, FieldPath]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str):
                    yield where + (key,), key
                stack.append((child, where + (key,)))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, where + (index,)) for index, child in enumerate(item))


def surrogate_paths(value: Any) -> list[FieldPath]:
    """The paths of every text in a JSON-like value (keys too) that holds a lone surrogate."""
    return [path for path, text in _texts(value, ()) if has_surrogate(text)]


def text_problems(spec: GraphSpec) -> list[Problem]:
    """E_ENCODING for every text of `spec` holding a lone surrogate."""
    return [
        Problem(
            "E_ENCODING",
            "the text holds a lone surrogate (half of a UTF-16 character), which no record file can store",
            "write the whole character, or remove it",
            path,
        )
        for path, text in _texts(spec.model_dump(mode="python"), ())
        if has_surrogate(text)
    ]
