"""docs/architecture.md stays true: its module tables name every module of both packages,
once, and nothing that does not exist; the request path names functions that exist."""

from __future__ import annotations

import importlib
import re

from tests.paths import ROOT

TEXT = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = TEXT.index(f"## {title}")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start:] if end < 0 else TEXT[start:end]


def _table_modules(package: str) -> list[str]:
    modules = _section("Modules")
    part = modules[modules.index(f"(`{package}/`)"):]
    part = part[: part.find("\n### ", 1)] if "\n### " in part[1:] else part
    rows = [line for line in part.splitlines() if line.startswith("| `")]
    return [f"{package}/{name}" for row in rows for name in re.findall(r"`([\w/]+\.py)`", row.split("|")[1])]


def test_every_module_has_one_line():
    for package in ("rclc", "rclc_graph"):
        documented = _table_modules(package)
        assert len(documented) == len(set(documented)), sorted(name for name in documented if documented.count(name) > 1)
        present = {path.relative_to(ROOT).as_posix() for path in (ROOT / package).rglob("*.py")}
        assert set(documented) == present, {"undocumented": sorted(present - set(documented)),
                                            "gone": sorted(set(documented) - present)}


def test_the_request_path_names_functions_that_exist():
    path = _section("One request")
    hops = re.findall(r"`((?:rclc|rclc_graph)/[\w/]+\.py):([\w.]+)`", path)
    assert len(hops) >= 30
    for file, qualified in hops:
        module = importlib.import_module(file[: -len(".py")].replace("/", "."))
        target = module
        for part in qualified.split("."):
            target = getattr(target, part)


# issue 25: the five everyday changes, each as "files to touch", at most three files each
def test_every_everyday_change_lists_at_most_three_files_that_exist():
    section = _section("Files to touch")
    changes = re.findall(r"^- \*\*(.+?)\*\*: (.*?)(?=^- \*\*|\Z)", section, re.M | re.S)
    assert [name for name, _ in changes] == ["Add an edge policy option", "Add a selector", "Add an executor",
                                            "Add an HTTP endpoint", "Change per-hop lineage"]
    for name, text in changes:
        files = re.findall(r"`((?:rclc|rclc_graph)/[\w/<>]+\.py)", text.split("Docs:")[0])
        assert 1 <= len(files) <= 3, (name, files)
        for file in files:
            if "<name>" in file:  # the new module itself: its folder exists
                assert (ROOT / file).parent.is_dir(), (name, file)
            else:
                assert (ROOT / file).is_file(), (name, file)
