"""Run inputs from a file: a `.json` file is one run's inputs, each non-blank line of a
`.jsonl` file one run's (what `rclc-graph run/validate/draw --input` read).

Every problem is a ValueError naming `--input`, the file (and line) and what to write instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_inputs(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(label, inputs) per run: a .json file is one run, each non-blank line of a .jsonl one run."""
    if not path.is_file():
        raise ValueError(f"--input: {str(path)!r} is not a file; pass a .json or .jsonl file of run inputs")
    suffix = path.suffix.lower()
    if suffix not in (".json", ".jsonl"):
        raise ValueError(f"--input: {str(path)!r} must end in .json (one run) or .jsonl (one run per line)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"--input: {str(path)!r} is not UTF-8 text") from None
    runs: list[tuple[str, dict[str, Any]]] = []
    if suffix == ".json":
        data = _parse(text, path, line=None)
        if not isinstance(data, dict):
            raise ValueError(f"--input: {path} holds a {type(data).__name__}; it must be one JSON object of input values")
        return [(str(path), data)]
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        data = _parse(line, path, line=number)
        if not isinstance(data, dict):
            raise ValueError(f"--input: {path}:{number} is not a JSON object; each line holds one run's inputs")
        runs.append((f"{path}:{number}", data))
    if not runs:
        raise ValueError(f"--input: {path} holds no runs; write one JSON object per line")
    return runs


def _parse(text: str, path: Path, *, line: int | None) -> Any:
    """JSON, or a ValueError naming the file, the line (of the file, or `line` for one line
    of a .jsonl file) and the column where it stops parsing."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        row = error.lineno if line is None else line
        raise ValueError(f"--input: {path}:{row}:{error.colno}: not valid JSON ({error.msg})") from None
