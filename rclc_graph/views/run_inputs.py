"""Run inputs from a file: a `.json` file is one run's inputs, each non-blank line of a
`.jsonl` file one run's (what `rclc-graph run/validate/draw --input` read). `--input -` reads
standard input: one JSON object is one run, several lines of objects are one run each.

Every problem is a ValueError naming `--input`, the file (and line) and what to write instead.
JSON is read with the graph's guards (spec/bounded_json.py: bounded nesting, no duplicate
keys). A file (or line) that could not hold `max_input_bytes` of text is refused before it
is parsed: no JSON escape takes more than 6 bytes per byte of text, so anything longer than
6 x the limit is too big whatever it holds; planning checks the exact size of the values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..plan.input_checks import DEFAULT_MAX_INPUT_BYTES
from ..spec.bounded_json import JSONLimitError, loads
from ..errors import UsageError

STDIN = "-"
_ESCAPE_FACTOR = 6  # "\u00e9": the longest JSON spelling of one byte of text


def read_inputs(path: Path, *, max_input_bytes: int | None = DEFAULT_MAX_INPUT_BYTES) -> list[tuple[str, dict[str, Any]]]:
    """(label, inputs) per run: a .json file is one run, each non-blank line of a .jsonl one run;
    `-` is standard input (one object, or one object per line)."""
    ceiling = None if max_input_bytes is None else max_input_bytes * _ESCAPE_FACTOR + 1024
    if str(path) == STDIN:
        return _read_stdin(ceiling)
    if not path.is_file():
        raise UsageError(f"--input: {str(path)!r} is not a file; pass a .json or .jsonl file of run inputs, or - for stdin")
    suffix = path.suffix.lower()
    if suffix not in (".json", ".jsonl"):
        raise UsageError(f"--input: {str(path)!r} must end in .json (one run) or .jsonl (one run per line)")
    if suffix == ".json" and ceiling is not None and path.stat().st_size > ceiling:
        raise UsageError(_too_big(str(path), path.stat().st_size, max_input_bytes))
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"--input: {str(path)!r} is not UTF-8 text") from None
    if suffix == ".json":
        return [(str(path), _one_run(text, str(path)))]
    return _runs(text, str(path), ceiling, max_input_bytes)


def _read_stdin(ceiling: int | None) -> list[tuple[str, dict[str, Any]]]:
    data = sys.stdin.buffer.read() if ceiling is None else sys.stdin.buffer.read(ceiling + 1)
    if ceiling is not None and len(data) > ceiling:
        raise UsageError(_too_big("<stdin>", len(data), (ceiling - 1024) // _ESCAPE_FACTOR, at_least=True))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError("--input: standard input is not UTF-8 text") from None
    if not text.strip():
        raise UsageError("--input: standard input is empty; pipe in a JSON object of input values")
    try:  # one object (possibly spread over lines) is one run ...
        loads(text)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":  # ... several objects: one per line, as in a .jsonl file
            return _runs(text, "<stdin>", ceiling, None)
    except JSONLimitError:
        pass  # reported with its place below
    return [("<stdin>", _one_run(text, "<stdin>"))]


def _one_run(text: str, where: str) -> dict[str, Any]:
    data = _parse(text, where, line=None)
    if not isinstance(data, dict):
        raise UsageError(f"--input: {where} holds a {type(data).__name__}; it must be one JSON object of input values")
    return data


def _runs(text: str, where: str, ceiling: int | None, limit: int | None) -> list[tuple[str, dict[str, Any]]]:
    runs: list[tuple[str, dict[str, Any]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if ceiling is not None and len(line) > ceiling:
            raise UsageError(_too_big(f"{where}:{number}", len(line.encode("utf-8")), limit))
        data = _parse(line, where, line=number)
        if not isinstance(data, dict):
            raise UsageError(f"--input: {where}:{number} is not a JSON object; each line holds one run's inputs")
        runs.append((f"{where}:{number}", data))
    if not runs:
        raise UsageError(f"--input: {where} holds no runs; write one JSON object per line")
    return runs


def _too_big(where: str, size: int, limit: int | None, *, at_least: bool = False) -> str:
    return (
        f"--input: {where} is {'more than ' if at_least else ''}{size} bytes, more than one run's inputs may hold "
        f"(the limit is {limit} bytes of text); pass shorter inputs or raise --max-input-bytes"
    )


def _parse(text: str, where: str, *, line: int | None) -> Any:
    """JSON, or a ValueError naming the file, the line (of the file, or `line` for one line
    of a .jsonl file) and the column where it stops parsing."""
    try:
        return loads(text)
    except json.JSONDecodeError as error:
        row = error.lineno if line is None else line
        raise UsageError(f"--input: {where}:{row}:{error.colno}: not valid JSON ({error.msg})") from None
    except JSONLimitError as error:
        at = where if line is None else f"{where}:{line}"
        raise UsageError(f"--input: {at}: {error}; input values are strings or lists of strings") from None
