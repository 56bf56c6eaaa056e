"""Checks on run inputs' text: their size in bytes and that every text is valid Unicode.

Inputs are tokenized only once a run is planned (preflight counts prompts against each
model's context), and tokenizing a 60 MB question takes minutes and gigabytes before the
context check could refuse it. Input values are therefore refused by size first, in UTF-8
bytes summed over every value of one run (`DEFAULT_MAX_INPUT_BYTES`, configurable: the
`max_input_bytes` argument of `compile_plan`/`expand`, `--max-input-bytes` on the command
line). No local model's context holds anywhere near the default's worth of text, so the limit
refuses only inputs that could never fit.

A lone surrogate (JSON's `"\\ud800"`, or a Python string built from one) is no character:
it would fail with a UnicodeEncodeError when the run writes its record, after the models
loaded. It is refused here, with the input's path.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..errors import FieldPath, Problem
from ..spec.safe_yaml import has_surrogate

DEFAULT_MAX_INPUT_BYTES = 4 << 20  # 4 MiB of input text per run


def _texts(values: Mapping[str, Any]) -> Iterator[tuple[FieldPath, str]]:
    for key, value in values.items():
        if isinstance(value, str):
            yield ("inputs", key), value
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                if isinstance(item, str):
                    yield ("inputs", key, index), item


def input_text_problems(values: Mapping[str, Any], max_bytes: int | None) -> list[Problem]:
    """E_ENCODING for texts holding lone surrogates, E_INPUT_SIZE when the texts together
    exceed `max_bytes` UTF-8 bytes (None: no limit)."""
    problems: list[Problem] = []
    total = 0
    for path, text in _texts(values):
        if has_surrogate(text):
            problems.append(Problem(
                "E_ENCODING",
                f"input {'.'.join(str(part) for part in path[1:])} holds a lone surrogate (half of a UTF-16 character)",
                "pass valid Unicode text (a JSON escape such as \\ud800 needs its other half)",
                path,
            ))
            continue
        total += len(text) if text.isascii() else len(text.encode("utf-8"))  # ASCII: one byte a character, no copy
    if max_bytes is not None and total > max_bytes:
        problems.append(Problem(
            "E_INPUT_SIZE",
            f"the inputs hold {total} bytes of text, more than the {max_bytes}-byte limit",
            "pass shorter inputs (split long documents across runs or foreach copies), or raise the limit "
            "(--max-input-bytes, max_input_bytes=)",
            ("inputs",),
        ))
    return problems
