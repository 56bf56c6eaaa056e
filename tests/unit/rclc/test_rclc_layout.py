"""The shape of the `rclc` package: a torch-free import, one error tree, public names, no circles.

These read the package's own source (AST) or import it in a fresh interpreter, so a change
that breaks a rule of the layout fails here rather than in a review.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import rclc
from rclc import errors
from rclc.backends import Backend, HFBackend
from tests.paths import ROOT

PACKAGE = ROOT / "rclc"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )
    return result.stdout.strip()


# ---------------------------------------------------------------------------------------
# import rclc is cheap


def test_import_rclc_is_torch_free_until_a_torch_backed_name_is_used():
    code = (
        "import sys\n"
        "import rclc, rclc.policy, rclc.files, rclc.errors, rclc.models\n"
        "from rclc import RclcError, Selection, Span, check\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
        "print(callable(rclc.transfer), rclc.transfer.__module__, 'torch' in sys.modules)\n"
    )
    lines = _run(code).splitlines()
    assert lines == ["False False", "True rclc.pipeline True"]


def test_rclc_transfer_stays_the_function_whatever_is_imported_first():
    code = "import rclc.pipeline, rclc.agent, rclc; print(callable(rclc.transfer), callable(rclc.bind))"
    assert _run(code) == "True True"


def test_every_public_name_resolves_and_is_documented():
    for name in rclc.__all__:
        value = getattr(rclc, name)
        if name != "__version__":
            assert inspect.getdoc(value), f"rclc.{name} has no docstring"
    assert set(rclc.__all__) <= set(dir(rclc))
    for module in ("backends", "errors", "files", "models", "policy", "selectors", "testing", "vllm"):
        assert getattr(rclc, module).__doc__, f"rclc.{module} has no module docstring"
    with pytest.raises(AttributeError, match="no_such_name"):
        rclc.no_such_name  # noqa: B018


def _public_functions():
    """Functions (and methods of classes) that public modules export."""
    modules = [rclc.policy, rclc.files, rclc.errors, rclc.testing, rclc.generation, rclc.models, rclc.selectors,
               rclc.vllm, rclc.backends]
    for module in modules:
        names = getattr(module, "__all__", None)
        if names is None:  # no __all__: the public functions the module defines itself
            names = [
                n for n, v in vars(module).items()
                if not n.startswith("_") and getattr(v, "__module__", "") == module.__name__
            ]
        for name in names:
            value = getattr(module, name)
            yield f"{module.__name__}.{name}", value
            if inspect.isclass(value):
                for attribute, member in vars(value).items():
                    if inspect.isfunction(member) and not attribute.startswith("_"):
                        yield f"{module.__name__}.{name}.{attribute}", member
    for name in rclc.__all__:
        value = getattr(rclc, name)
        if inspect.isclass(value):
            for attribute, member in vars(value).items():
                if inspect.isfunction(member) and not attribute.startswith("_"):
                    yield f"rclc.{name}.{attribute}", member
        elif inspect.isfunction(value):
            yield f"rclc.{name}", value


def test_public_functions_have_type_hints_and_docstrings():
    for where, function in _public_functions():
        if inspect.isclass(function):
            assert inspect.getdoc(function), f"{where} has no docstring"
        if not inspect.isfunction(function):
            continue
        assert inspect.getdoc(function), f"{where} has no docstring"
        signature = inspect.signature(function)
        missing = [
            p.name for p in signature.parameters.values()
            if p.annotation is inspect.Parameter.empty and p.name not in ("self", "cls")
        ]
        assert not missing, f"{where}: parameters {missing} have no type hint"
        assert signature.return_annotation is not inspect.Signature.empty, f"{where}: no return type hint"


def test_package_ships_a_typed_marker():
    assert (PACKAGE / "py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["rclc"]  # in the wheel, not only here


# ---------------------------------------------------------------------------------------
# One exception tree


ERRORS = [getattr(errors, name) for name in errors.__all__]


def test_error_tree():
    value_errors = {error for error in ERRORS if issubclass(error, ValueError)}
    assert all(issubclass(error, errors.RclcError) for error in value_errors)
    assert issubclass(errors.RclcError, ValueError) and issubclass(errors.EmptyInboxError, IndexError)
    runtime = set(ERRORS) - value_errors
    assert runtime == {errors.EngineBusyError, errors.CaptureError}
    assert all(issubclass(error, RuntimeError) for error in runtime)
    assert len(ERRORS) <= 12  # a small tree: each class is a distinct way to react (ConstraintError: a grammar)
    for error in ERRORS:
        assert getattr(rclc, error.__name__) is error
        doc = inspect.getdoc(error) or ""
        assert doc and "\n" not in doc and doc.startswith("Raised"), f"{error.__name__}: one line saying when"
        assert error.__name__ in errors.__doc__, f"{error.__name__} is missing from the tree drawn in the docs"


def _calls(tree: ast.AST, names: set[str]):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            yield node


def test_no_bare_builtin_errors_are_raised():
    """Every input error is an rclc.errors class (they subclass ValueError, so callers keep working)."""
    found = []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for node in _calls(tree, {"ValueError", "IndexError"}):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"bare ValueError/IndexError raised at {found}"


# ---------------------------------------------------------------------------------------
# Imports: no circles, lazy ones say why


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_package(name: str) -> bool:
    return (ROOT / Path(*name.split(".")) / "__init__.py").is_file()


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    """The rclc modules an import statement makes this module import at load time."""
    if node.level:
        base = module.split(".") if _is_package(module) else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("rclc"):
        return []
    found = [target]
    for alias in node.names:
        child = f"{target}.{alias.name}"
        if _is_package(child) or (ROOT / Path(*child.split("."))).with_suffix(".py").is_file():
            found.append(child)
    return found


def _top_level_imports(tree: ast.Module):
    """Import statements that run when the module loads (not in functions, not TYPE_CHECKING-only)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending.extend(ast.iter_child_nodes(node))


def test_no_import_circles():
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        module = _module_name(path)
        targets: set[str] = set()
        for node in _top_level_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                targets.update(_resolve(module, node))
            else:
                targets.update(alias.name for alias in node.names if alias.name.startswith("rclc"))
        # importing rclc.a.b runs rclc.a's __init__ first; a module's own packages are already loading
        ancestors = {module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1)}
        for target in list(targets):
            targets.update(target.rsplit(".", depth)[0] for depth in range(1, target.count(".") + 1))
        graph[module] = targets - ancestors - {module}
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if target not in graph:
                continue
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join([*trail, module, target]))
            if target not in state:
                visit(target, [*trail, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_imports_inside_functions_say_why():
    """Lazy imports are for optional extras and heavy dependencies only, each with a comment."""
    unexplained = []
    for path in SOURCES:
        text = path.read_text()
        lines = text.splitlines()
        for function in ast.walk(ast.parse(text)):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    above = node.lineno - 2  # the comment may sit above a block of imports
                    while lines[above].strip().startswith(("import ", "from ")):
                        above -= 1
                    if "#" not in lines[node.lineno - 1] and not lines[above].strip().startswith("#"):
                        unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unexplained, f"imports inside functions without a comment saying why: {unexplained}"


# ---------------------------------------------------------------------------------------
# The backend contract

# Its methods: the abstract ones and those with a default a backend may override (state_inputs).
CONTRACT_METHODS = set(Backend.__abstractmethods__) | {
    name for name, value in vars(Backend).items() if not name.startswith("_") and callable(value)
}


def test_hf_backend_implements_the_whole_contract():
    assert issubclass(HFBackend, Backend) and not HFBackend.__abstractmethods__
    assert "state_inputs" in CONTRACT_METHODS
    for name in CONTRACT_METHODS:
        contract, implementation = getattr(Backend, name), getattr(HFBackend, name)
        if isinstance(contract, property):
            assert isinstance(implementation, property), name
            continue
        assert list(inspect.signature(implementation).parameters) == list(inspect.signature(contract).parameters), name
    assert HFBackend.name == "hf" and isinstance(HFBackend.records_by_prefill, bool)


def test_the_contract_lists_every_backend_method_agent_calls():
    source = (PACKAGE / "agent.py").read_text() + (PACKAGE / "backends" / "native.py").read_text()
    called = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            if node.value.attr == "_backend":
                called.add(node.attr)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "backend":
            called.add(node.attr)
    declared = CONTRACT_METHODS | {"name", "records_by_prefill", "model", "tokenizer", "engine"}
    assert called and called <= declared, f"Agent calls {sorted(called - declared)} outside the contract"
