"""The public surface of rclc_graph: one grouped `__all__`, a docstring on every export and on
every public method, a py.typed marker, and the executor contract implemented in full."""

from __future__ import annotations

import dataclasses
import inspect
import pathlib
import re

import pytest

import rclc_graph
from rclc_graph import errors, testing
from rclc_graph.executors import DelegatingExecutor, Executor, LocalExecutor, ModelPool
from rclc_graph.executors.remote import RemoteExecutor
from rclc_graph.run import RecordingExecutor

PACKAGE = pathlib.Path(rclc_graph.__file__).parent


def _own_doc(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
        return ""  # the signature dataclasses write when a class has no docstring
    return doc.strip()


def test_all_lists_each_name_once_and_every_name_exists():
    assert len(rclc_graph.__all__) == len(set(rclc_graph.__all__))
    for name in rclc_graph.__all__:
        assert hasattr(rclc_graph, name), name


def test_all_is_sorted_within_each_commented_group():
    source = (PACKAGE / "__init__.py").read_text()
    body = source[source.index("__all__ = [") :]
    groups = re.split(r"\n    # [^\n]*", body.split("]", 1)[0])[1:]
    assert len(groups) >= 6
    for group in groups:
        names = re.findall(r'"(\w+)"', group)
        assert names == sorted(names, key=lambda name: (name[0].islower(), name)), names


def test_every_export_and_its_public_methods_have_a_docstring():
    missing = []
    for name in rclc_graph.__all__:
        obj = getattr(rclc_graph, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not _own_doc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for attribute, member in vars(obj).items():
                if attribute.startswith("_"):
                    continue
                if isinstance(member, property):
                    target = member.fget
                elif isinstance(member, (classmethod, staticmethod)):
                    target = member.__func__
                elif inspect.isfunction(member):
                    target = getattr(obj, attribute)
                else:
                    continue
                if not (inspect.getdoc(target) or "").strip():
                    missing.append(f"{name}.{attribute}")
    assert missing == []


def test_py_typed_marker_ships():
    assert (PACKAGE / "py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["rclc_graph"]  # in the wheel, not only here


CONTRACT = sorted(Executor.__abstractmethods__)


def test_the_contract_lists_what_callers_use():
    assert CONTRACT == ["adopt", "agent", "bind", "close", "fingerprints", "prepare", "release", "run_node"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: LocalExecutor(ModelPool()),
        lambda: testing.FakeExecutor(),
        lambda: testing.InProcessReplicasExecutor(ModelPool()),
        lambda: DelegatingExecutor(testing.FakeExecutor()),
    ],
    ids=["local", "fake", "in-process-replicas", "delegating"],
)
def test_executors_implement_the_whole_contract(make):
    executor = make()
    assert isinstance(executor, Executor) and isinstance(executor.name, str) and executor.name
    for method in CONTRACT:
        assert callable(getattr(type(executor), method)), method
    assert "__getattr__" not in vars(type(executor))


def test_recording_and_remote_executors_forward_or_implement_every_method():
    assert not RecordingExecutor.__abstractmethods__ and issubclass(RecordingExecutor, DelegatingExecutor)
    assert "__getattr__" not in vars(RecordingExecutor)
    assert set(RemoteExecutor.__abstractmethods__) == {"_start_host"}  # a backend says how replicas start


def test_an_incomplete_executor_cannot_be_made():
    class RunsOnly(Executor):
        name = "partial"

        async def run_node(self, ctx, node, inbound):
            raise NotImplementedError

    with pytest.raises(TypeError, match="abstract"):
        RunsOnly()


def test_every_exception_class_lives_in_errors_py():
    defined = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for match in re.finditer(r"^class (\w+)\((.*)\):", path.read_text(), re.M):
            bases = match.group(2)
            if re.search(r"(Exception|Error|Failed|Died|Unavailable|Failure)\b", bases):
                defined.append((path.relative_to(PACKAGE).as_posix(), match.group(1)))
    assert {path for path, _ in defined} == {"errors.py"}, defined
    tree = (PACKAGE / "errors.py").read_text().split('"""')[1]
    for _, name in defined:
        assert re.search(rf"\b{name}\b", tree), f"{name} is not drawn in the tree at the top of errors.py"
        assert inspect.getdoc(getattr(errors, name)), name
        assert issubclass(getattr(errors, name), errors.RclcGraphError), name


def test_something_that_is_not_an_executor_is_refused_by_name():
    from rclc_graph import Graph, run_plan_sync

    graph = Graph("one").input("question")
    graph.model("base").agent("reader", model="base")
    graph.node("answer", agent="reader", prompt="{question}", output=True)

    class DuckTyped:  # has run_node and release, but not the contract
        name = "duck"

        async def run_node(self, ctx, node, inbound):
            raise AssertionError("never called")

        def release(self, run_id):
            pass

    with pytest.raises(ValueError, match="executor: DuckTyped is not an executor"):
        run_plan_sync(graph.plan({"question": "q"}), executor=DuckTyped())
    with pytest.raises(ValueError, match="inner: DuckTyped is not an executor"):
        DelegatingExecutor(DuckTyped())
