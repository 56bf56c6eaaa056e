"""docs/reliability.md's table of issue 16 items stays true: one row per item, and every test
it names exists and carries that item's marker (issue 16, Must show)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.paths import ROOT


def _rows() -> dict[int, str]:
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    section = text.split("## Hardening items (issue 16)", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| (\d+) [^|]+\|[^|]+\| (.+) \|$", line)
        if match:
            rows[int(match.group(1))] = match.group(2)
    return rows

def _test_file(reference: str) -> Path:
    """A path from the repository root, or a bare file name: the unit test of that name, in
    whichever package folder of tests/unit it lives (tests/README.md)."""
    if "/" in reference:
        return ROOT / reference
    found = sorted((ROOT / "tests" / "unit").rglob(reference))
    assert len(found) == 1, f"{reference}: {len(found)} unit tests of that name"
    return found[0]


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_item_has_a_row_whose_tests_exist_and_are_marked():
    rows = _rows()
    assert sorted(rows) == list(range(1, 21))
    for item, cell in rows.items():
        current: Path | None = None
        references = re.findall(r"`([^`]+)`", cell)
        assert references, f"item {item} names no test"
        for reference in references:
            file, _, function = reference.partition("::")
            if file:
                current = _test_file(file)
                assert current.is_file(), f"item {item}: {current} does not exist"
                marker = re.compile(rf"issue 16 items? [^\n]*\b{item}\b")
                assert marker.search(current.read_text(encoding="utf-8")), f"item {item}: {current} has no marker"
            if function:
                assert current is not None and function in _test_names(current), f"item {item}: {reference} not found"


ISSUE_24_ITEMS = ["tmpfiles", "wrap", *map(str, range(1, 14)), "D1", "D2", "properties"]


def _issue_24_rows() -> dict[str, str]:
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    section = text.split("## Hardening items (issue 24)", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]  # "\|" inside a cell is text
        if len(cells) == 4 and cells[0] not in ("Item", "---"):
            rows[cells[0]] = cells[3]
    return rows


def _marker(item: str) -> re.Pattern[str]:
    if item == "properties":
        return re.compile(r"issue 24 properties")
    return re.compile(rf"issue 24 (?:items?|defects?) [^\n]*(?<![\w-]){re.escape(item)}(?![\w-])")


# issue 24: one row per item, every test it names exists and carries that item's marker
def test_every_issue_24_item_has_a_row_whose_tests_exist_and_are_marked():
    rows = _issue_24_rows()
    assert list(rows) == ISSUE_24_ITEMS
    for item, cell in rows.items():
        current: Path | None = None
        references = re.findall(r"`([^`]+)`", cell)
        assert references, f"item {item} names no test"
        for reference in references:
            file, _, function = reference.partition("::")
            if file:
                current = _test_file(file)
                assert current.is_file(), f"item {item}: {current} does not exist"
                assert _marker(item).search(current.read_text(encoding="utf-8")), f"item {item}: {current} has no marker"
            if function:
                assert current is not None and function in _test_names(current), f"item {item}: {reference} not found"
