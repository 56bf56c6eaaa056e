"""The graph layer's error codes: an Enum documented once, plain strings still work."""

from __future__ import annotations

import json

import pytest

from rclc_graph import ErrorCode, GraphError, PlanError, Problem, SpecError
from rclc_graph.errors import RclcGraphError
from tests.paths import ROOT



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


def test_the_exception_tree_in_the_docs_is_the_one_errors_py_draws():
    import rclc_graph.errors as errors

    drawn = [line[4:] for line in errors.__doc__.splitlines() if line.startswith(("    RclcGraphError", "    ├", "    │", "    └"))]
    assert drawn and "\n".join(drawn) in (ROOT / "docs" / "yaml_reference.md").read_text()
    named = {line.replace("│", " ").split()[1 if line[0] in "├│└" else 0] for line in drawn}
    named = {name for name in named if name not in ("├──", "└──")}
    defined = {name for name, value in vars(errors).items() if isinstance(value, type) and issubclass(value, errors.RclcGraphError)}
    assert named == defined  # every class of the module is drawn, and nothing else


# issue 25 item 5: every error the graph layer raises on purpose sits in its tree
def test_usage_errors_are_value_errors_in_the_tree_and_node_failed_wraps_once():
    from rclc_graph.errors import Interrupt, NodeFailed, UsageError, node_failed

    assert issubclass(UsageError, ValueError) and issubclass(UsageError, RclcGraphError)
    with pytest.raises(NodeFailed, match=r"node 'n': KeyError: 'x'") as caught:
        with node_failed("n"):
            raise KeyError("x")
    assert isinstance(caught.value.cause, KeyError) and caught.value.__cause__ is caught.value.cause
    inner = NodeFailed("deep", RuntimeError("broke"))
    with pytest.raises(NodeFailed) as again:
        with node_failed("outer"):
            raise inner
    assert again.value is inner  # a deeper layer's NodeFailed passes as it is
    with pytest.raises(Interrupt):
        with node_failed("n"):
            raise Interrupt("a question for a person")


def test_no_bare_value_error_is_raised_in_the_graph_layer():
    sources = sorted((ROOT / "rclc_graph").rglob("*.py"))
    bare = [f"{path.relative_to(ROOT)}:{number}" for path in sources
            for number, line in enumerate(path.read_text().splitlines(), 1) if "raise ValueError(" in line]
    assert not bare, bare


def test_the_server_codes_are_members_of_the_one_vocabulary():
    """The server names its refusals by ErrorCode members, not by aliases of its own."""
    import json

    from rclc_graph.server import errors as server_errors

    assert not [name for name in vars(server_errors) if name.startswith("E_")]
    body = server_errors.error_body(429, ErrorCode.E_BUSY, "full")
    assert json.loads(json.dumps(body))["error"]["code"] == "E_BUSY"
