"""topologies/tool_agent.yaml on the Ray executor gives the local executor's outputs.

A simulated two-machine cluster (one CPU each); the embedded model gets two replicas and the
writer is pinned to the second, so the support agent's state (its tool results included)
crosses machines. The support node's tool loop is scripted (tests/helpers/scripted_tools.py) in this
process and, through Ray's `worker_process_setup_hook`, in every actor, so the loop runs on
the actor: the tool is imported there (examples/ on the workers' PYTHONPATH), queries
examples/shop.sqlite and its result is appended to the actor's agent. Needs the optional
extra (pip install 'rclc-graph[ray]'); skipped without it.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import anyio
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from tests.helpers.scripted_tools import ENV, TOOL_AGENT_REPLIES, install, uninstall  # noqa: E402
from rclc_graph import EventStream, LocalExecutor, ModelPool, plan_file, run_plan  # noqa: E402
from rclc_graph.executors.ray import RayExecutor  # noqa: E402
from tests.paths import ROOT

pytestmark = [pytest.mark.ray, pytest.mark.integration]

PATHS = [str(ROOT), str(ROOT / "examples")]


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    runtime_env = {
        "env_vars": {ENV: json.dumps(TOOL_AGENT_REPLIES),
                     "PYTHONPATH": os.pathsep.join(PATHS + [os.environ.get("PYTHONPATH", "")])},
        "worker_process_setup_hook": "tests.helpers.scripted_tools.install_from_env",
    }
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING", runtime_env=runtime_env)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def plan(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    install(TOOL_AGENT_REPLIES)
    yield plan_file(ROOT / "topologies" / "tool_agent.yaml",
                    json.loads((ROOT / "examples" / "inputs" / "tool_agent.json").read_text()), trust_code=True)
    uninstall()


def _without_seconds(calls):
    return [{key: value for key, value in call.items() if key != "seconds"} for call in calls]


def _tool_events(plan, executor):
    """The run's result and its `tool` events' payloads (they come from the replica on Ray)."""
    events = EventStream()
    seen: list = []

    async def main():
        async def consume():
            async for event in events:
                seen.append(event)

        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            result = await run_plan(plan, executor=executor, events=events)
            events.close()
        return result

    result = anyio.run(main)
    return result, [dict(event.payload) for event in seen if event.kind == "tool"]


def test_tool_agent_on_ray_equals_local(cluster, plan):
    local, local_events = _tool_events(plan, LocalExecutor(ModelPool()))
    assert local.status == "finished", local.error
    assert [call["name"] for call in local.nodes["support"].tool_calls] == ["lookup_order"]
    assert [event["phase"] for event in local_events] == ["call", "result"]
    with RayExecutor(replicas={"base": 2}, pins={"support": 0, "reply": 1}) as executor:
        remote, remote_events = _tool_events(plan, executor)
    assert remote_events == local_events  # the call and its result, published from the actor
    assert remote.status == "finished", remote.error
    assert remote.outputs == local.outputs
    for name, node in local.nodes.items():
        other = remote.nodes[name]
        assert (other.text, other.positions, other.lineage) == (node.text, node.positions, node.lineage), name
        assert _without_seconds(other.tool_calls) == _without_seconds(node.tool_calls), name
    [hop] = remote.hops
    assert hop.placement["sender"]["node"] != hop.placement["receiver"]["node"]  # the state crossed machines
    assert hop.kept_positions == local.hops[0].kept_positions == 256  # tool_agent.yaml's findings budget
    assert remote.nodes["support"].placement["replica"] == "base#0"
    assert remote.nodes["reply"].placement["replica"] == "base#1"
