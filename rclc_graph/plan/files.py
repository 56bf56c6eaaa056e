"""Topology files straight to a `Blueprint` or a `Plan`, with file and line in every error.

Reading is the spec layer's job (`spec.load`), checking and compiling this layer's; these two
functions join them for callers that start from a path (the CLI, resume, experiments), and
put the YAML location back on whole-graph problems, which validation finds without it.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from ..errors import PlanError
from ..spec.load import DEFAULT_MAX_BYTES, read_graph
from .compile import compile_plan
from .input_checks import DEFAULT_MAX_INPUT_BYTES
from .dag import Plan
from .validate import Blueprint, validate


def validate_file(
    path: str | os.PathLike[str],
    *,
    trust_code: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    trusted_files: bool | None = None,
) -> Blueprint:
    """Load and validate a topology; graph-level errors also name file and line.
    `trusted_files` (default: `trust_code`): profile files may live outside the topology's
    directory tree (spec/load.py)."""
    loaded = read_graph(path, max_bytes=max_bytes, trusted=trust_code if trusted_files is None else trusted_files)
    try:
        return validate(loaded.spec, trust_code=trust_code)
    except PlanError as exc:
        raise exc.with_locations(loaded.locate) from None


def plan_file(
    path: str | os.PathLike[str],
    inputs: Mapping[str, Any] | None = None,
    *,
    trust_code: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_input_bytes: int | None = DEFAULT_MAX_INPUT_BYTES,
    answers: Mapping[str, str] | None = None,
    functions: Mapping[str, Callable[..., Any]] | None = None,
    trusted_files: bool | None = None,
) -> Plan:
    """Load, validate and compile a topology for one run's inputs (`max_input_bytes`: the
    inputs' text limit, see input_checks.py) and people's answers to its interrupts, by node;
    `functions`: callables for its function nodes by `call` reference (not imported);
    `trusted_files` as for `validate_file`."""
    loaded = read_graph(path, max_bytes=max_bytes, trusted=trust_code if trusted_files is None else trusted_files)
    try:
        return compile_plan(
            loaded.spec, inputs or {}, trust_code=trust_code, max_input_bytes=max_input_bytes, answers=answers,
            functions=functions,
        )
    except PlanError as exc:
        raise exc.with_locations(loaded.locate) from None
