"""docs/from_langgraph.md stays true where it can be checked: its topology validates (names
code, so only with trust_code), every plain edge resolves as the page says, and the pages it
points to exist."""

from __future__ import annotations

import re

import pytest

from rclc_graph import PlanError, compile_plan, load_graph_text

from tests.paths import ROOT
PAGE = (ROOT / "docs" / "from_langgraph.md").read_text(encoding="utf-8")


def test_the_triage_topology_validates_and_its_plain_edges_resolve_as_said():
    (text,) = [block for block in re.findall(r"^```yaml\n(.*?)^```", PAGE, re.DOTALL | re.MULTILINE)
               if block.startswith("version: 1")]
    spec = load_graph_text(text)
    with pytest.raises(PlanError, match="E_TRUST_CODE"):
        compile_plan(spec, {"message": "A refund, please"})
    plan = compile_plan(spec, {"message": "A refund, please"}, trust_code=True)
    modes = {(edge.source, edge.target): edge.policy.label for edge in plan.edges}
    assert modes[("triage", "billing")] == "r4" and modes[("lookup", "billing")] == "text"


def test_every_page_it_points_to_exists():
    for name in set(re.findall(r"docs/([\w_]+\.md)", PAGE)):
        assert (ROOT / "docs" / name).is_file(), name
