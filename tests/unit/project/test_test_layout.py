"""The tests keep the shape of the code (issue 25 item 6, tests/README.md): every unit test
lives in the folder of the package it tests, every test folder is a package, and helpers are
imported through the `tests.helpers` package, never by a bare module name (which only works
while pytest puts the test's own folder on sys.path, not under --import-mode=importlib)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT, TESTS

UNIT = TESTS / "unit"
PACKAGES = ("rclc", "rclc_graph")


def _test_folders() -> list[Path]:
    return sorted({TESTS, *(path for path in TESTS.rglob("*") if path.is_dir() and path.name != "__pycache__")})


def _module_names(folder: Path) -> set[str]:
    """What a bare import would find if pytest put this folder on sys.path: its .py files. (Its
    subfolders are named after packages of the code, which absolute imports mean instead.)"""
    return {child.stem for child in folder.glob("*.py")} - {"__init__"}


def test_no_unit_test_sits_directly_in_tests_unit():
    assert sorted(path.name for path in UNIT.glob("test_*.py")) == []


def test_every_unit_test_folder_mirrors_a_package_of_the_code():
    for folder in _test_folders():
        if UNIT not in folder.parents or folder.relative_to(UNIT).parts[0] == "project":
            continue  # tests/unit/project: checks over the whole repository (docs, imports, prints)
        mirrored = ROOT / folder.relative_to(UNIT)
        assert folder.relative_to(UNIT).parts[0] in PACKAGES, f"{folder}: not a folder of {PACKAGES}"
        assert (mirrored / "__init__.py").is_file(), f"{folder}: {mirrored} is no package of the code"


def test_every_test_folder_is_a_package():
    missing = [str(folder.relative_to(ROOT)) for folder in _test_folders() if any(folder.glob("*.py"))
               and not (folder / "__init__.py").is_file()]
    assert missing == []


def test_no_test_imports_a_helper_by_a_bare_module_name():
    # A bare name that is a file or package inside tests/ (a helper, another test, conftest)
    # resolves only through the folder pytest happened to put on sys.path.
    local = set().union(*(_module_names(folder) for folder in _test_folders()))
    bare = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            bare += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                     if name.split(".")[0] in local]
    assert bare == []
