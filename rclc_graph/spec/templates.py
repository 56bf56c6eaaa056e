"""Prompt and request templates: Python `string.Formatter` field syntax, kept deliberately small.

A template may use `{name}` (a run input or a node variable such as `item`, `index` or
`round`) and `{name[3]}` (one item of a list input). Attribute access, positional fields,
conversions (`!r`) and format specs are refused so a template can only read values, never
call into objects. Literal braces are written `{{` and `}}`.

List values render one item per line, so `{documents}` in a prompt reads naturally.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Mapping

from ..errors import UsageError

_FIELD = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<index>[0-9]+)\])?$")
_FORMATTER = string.Formatter()


@dataclass(frozen=True)
class Field:
    """One `{...}` of a template: a variable name and, for `{name[i]}`, the item index."""

    name: str
    index: int | None = None

    def __str__(self) -> str:
        return self.name if self.index is None else f"{self.name}[{self.index}]"


def fields(template: str) -> tuple[Field, ...]:
    """The fields of `template` in order of appearance; ValueError says what is malformed."""
    found: list[Field] = []
    try:
        parts = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise UsageError(f"malformed template ({exc}); write literal braces as {{{{ and }}}}") from None
    for _literal, field_name, format_spec, conversion in parts:
        if field_name is None:
            continue
        match = _FIELD.match(field_name)
        if match is None:
            raise UsageError(
                f"template field {{{field_name}}} is not allowed: use {{name}} or {{name[index]}}, "
                "where name is an input or node variable"
            )
        if conversion is not None or format_spec:
            raise UsageError(
                f"template field {{{field_name}}} has a conversion or format spec; use plain {{{field_name}}}"
            )
        index = match.group("index")
        found.append(Field(match.group("name"), None if index is None else int(index)))
    return tuple(found)


def render_value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return "\n".join(str(item) for item in value)
    return str(value)


def render(template: str, values: Mapping[str, object]) -> str:
    """Fill `template` from `values`; KeyError/IndexError/TypeError name the missing field.

    Validation (`fields` plus the plan's checks) runs first, so at run time these raise only
    on a programming error.
    """
    return render_spans(template, values)[0]


def render_spans(template: str, values: Mapping[str, object]) -> tuple[str, tuple[tuple[int, int], ...]]:
    """`render`, plus the character span `[start, stop)` of every filled-in value in the result.

    What is not a value is the template's own text: receiver-aware selection tells a sender's
    instructions (the template) from the material it read (the values) by these spans.
    """
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    length = 0
    for literal, field_name, _spec, _conversion in _FORMATTER.parse(template):
        out.append(literal)
        length += len(literal)
        if field_name is None:
            continue
        match = _FIELD.match(field_name)
        if match is None:
            raise UsageError(f"template field {{{field_name}}} is not allowed")
        value = values[match.group("name")]
        if match.group("index") is not None:
            if not isinstance(value, (list, tuple)):
                raise TypeError(f"template field {{{field_name}}}: {match.group('name')} is not a list")
            value = value[int(match.group("index"))]
        text = render_value(value)
        out.append(text)
        if text:
            spans.append((length, length + len(text)))
        length += len(text)
    return "".join(out), tuple(spans)
