"""A module next to a trusted topology file imports without PYTHONPATH (issue 27): function
nodes, routers and tools named `module:function` are found beside the YAML, only with
trust_code, and never in place of an installed module or the standard library."""

from __future__ import annotations

import json
import sys

import anyio
import pytest

from rclc_graph import GraphError, astream

TOPOLOGY = """\
version: 1
name: beside
inputs: {order: str}
nodes:
  - {name: lookup, call: "MODULE:find"}
  - {name: shout, call: "MODULE:shout", output: true}
edges:
  - {source: lookup, target: shout}
"""
MODULE = '''
import shop_helpers  # a sibling module imports too

def find(inputs, senders):
    return shop_helpers.describe(inputs["order"])

def shout(inputs, senders):
    import json  # the standard library's, not the json.py beside the topology
    return json.dumps({"heard": json.loads(senders["lookup"])})
'''
HELPERS = '''
def describe(order):
    return {"order": order, "status": "shipped"}
'''


def run(path, trust_code):
    async def main():
        async with astream(path, {"order": "A-17"}, trust_code=trust_code) as events:
            async for _ in events:
                pass
        return events.result

    return anyio.run(main)


@pytest.fixture
def project(tmp_path, monkeypatch):
    directory = tmp_path / "project"
    directory.mkdir()
    module = f"shop_orders_{tmp_path.name.replace('-', '_')}"
    (directory / f"{module}.py").write_text(MODULE)
    (directory / "shop_helpers.py").write_text(HELPERS)
    (directory / "json.py").write_text("raise RuntimeError('the file beside the topology shadowed json')\n")
    path = directory / "beside.yaml"
    path.write_text(TOPOLOGY.replace("MODULE", module))
    yield path, module
    for name in (module, "shop_helpers"):
        sys.modules.pop(name, None)


def test_a_function_beside_the_topology_runs_with_trust_code(project):
    path, module = project
    with pytest.raises(GraphError, match="E_TRUST_CODE"):
        run(path, trust_code=False)
    assert module not in sys.modules
    result = run(path, trust_code=True)
    assert result.status == "finished", result.error
    assert json.loads(result.outputs["shout"]) == {"heard": {"order": "A-17", "status": "shipped"}}
