"""docs/graphs.md stays runnable where it says so: the Python blocks of its "Function nodes",
"Human in the loop" and "Subgraphs" sections run in order as one session (function nodes only: no model), and
every YAML topology block of the new sections loads and validates."""

from __future__ import annotations

import re

import pytest

from rclc_graph import PlanError, load_graph_text, validate
from tests.paths import ROOT

GUIDE = (ROOT / "docs" / "graphs.md").read_text(encoding="utf-8")
RUNNABLE = ("Function nodes", "Human in the loop", "Subgraphs")
STEERING = ("Conditional edges", "Loops that stop") + RUNNABLE


def section(title: str) -> str:
    start = GUIDE.index(f"\n## {title}\n")
    end = GUIDE.find("\n## ", start + 1)
    return GUIDE[start:end]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def test_the_sections_say_their_blocks_run():
    assert "tests/unit/project/test_docs_graphs.py" in section("Human in the loop")
    assert sum(len(blocks(section(title), "python")) for title in RUNNABLE) >= 2


def test_python_blocks_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "docs_graphs"}
    for title in RUNNABLE:
        for number, source in enumerate(blocks(section(title), "python"), start=1):
            exec(compile(source, f"docs/graphs.md {title} block {number}", "exec"), namespace)  # noqa: S102 - our docs
    result = namespace["result"]
    assert result.status == "finished" and (tmp_path / "runs").is_dir()


def test_yaml_topologies_of_the_steering_sections_load_and_validate():
    checked = 0
    for title in STEERING:
        for text in blocks(section(title), "yaml"):
            if not text.startswith("version: 1"):
                continue  # an excerpt of a shipped topology (those are tested as files)
            spec = load_graph_text(text)
            with pytest.raises(PlanError) as caught:
                validate(spec)  # names code: refused without trust_code ...
            assert caught.value.codes() == ("E_TRUST_CODE",) * len(caught.value.problems)
            validate(spec, trust_code=True)  # ... and valid with it
            checked += 1
    assert checked >= 1
