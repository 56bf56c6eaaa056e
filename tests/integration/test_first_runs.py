"""A newcomer's first runs answer right (issue 26, "First runs that answer right"): each shipped
topology's example input whose question has a definite answer and the quickstart, on the
embedded model with the shipped default policies, `make demo` (chain_of_agents) included.

One run per example, greedy decoding (deterministic on this CPU build), the model loaded once
for the session. The inputs were rewritten to be well-posed for a 135M model (docs: README,
"What the 135M model gets right"); the policies are the topologies' own. The quickstart's
answer is checked where the quickstart already runs, tests/integration/test_quickstart.py, so
it runs once."""

from __future__ import annotations

import json

import anyio
import pytest

from rclc_graph import ModelPool, ModelSpec, plan_file, run_plan
from tests.paths import ROOT

pytestmark = pytest.mark.integration

# topology -> (output node, what a right answer contains).
EXPECTED = {
    "chain_of_agents": ("final", "Velden"),
    "fanout_qa": ("final", "Ada Holm"),
    "hierarchical": ("final", "green"),
    "debate": ("judge", "fruit"),
}


@pytest.fixture(scope="module")
def pool(embedded):
    shared = ModelPool()
    shared.add(ModelSpec(name="base", source="embedded"), *embedded)
    return shared


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_shipped_example_input_is_answered_right(name, pool):
    inputs = json.loads((ROOT / "examples" / "inputs" / f"{name}.json").read_text(encoding="utf-8"))
    plan = plan_file(ROOT / "topologies" / f"{name}.yaml", inputs)
    result = anyio.run(lambda: run_plan(plan, pool=pool))
    assert result.status == "finished", result.error
    output, right = EXPECTED[name]
    assert right.lower() in result.outputs[output].lower(), result.outputs

