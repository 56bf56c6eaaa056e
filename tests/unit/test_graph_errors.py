"""The graph layer's error codes: an Enum documented once, plain strings still work."""

from __future__ import annotations

import json
import pathlib

import pytest

from rclc_graph import ErrorCode, GraphError, PlanError, Problem, SpecError
from rclc_graph.errors import RclcGraphError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_codes_are_strings_and_members():
    problem = Problem("E_FIELD", "bad", "fix it", ("edges", 0))
    assert problem.code is ErrorCode.E_FIELD
    assert problem.code == "E_FIELD" and str(problem.code) == "E_FIELD" and f"{problem.code}" == "E_FIELD"
    assert "[E_FIELD]" in str(problem)
    assert json.loads(json.dumps(problem.to_dict()))["code"] == "E_FIELD"
    error = PlanError.one(ErrorCode.E_CYCLE, "a cycle", "declare rounds")
    assert error.code == "E_CYCLE" and error.codes() == ("E_CYCLE",)


def test_unknown_codes_are_refused():
    with pytest.raises(ValueError, match="not a documented error code"):
        Problem("E_NOPE", "bad", "fix it")
    with pytest.raises(ValueError, match="not a documented error code"):
        SpecError.one("E_NOPE", "bad", "fix it")


def test_every_code_is_documented_once_in_code_and_in_the_yaml_reference():
    reference = (ROOT / "docs" / "yaml_reference.md").read_text()
    for code in ErrorCode:
        assert code.value == code.name and code.description, code
        assert f"| `{code.value}` | {code.description} |" in reference, code  # the table shows the same text


def test_graph_errors_stay_value_errors_under_one_root():
    assert issubclass(GraphError, ValueError) and issubclass(GraphError, RclcGraphError)
    assert issubclass(SpecError, GraphError) and issubclass(PlanError, GraphError)
