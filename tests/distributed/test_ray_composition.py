"""Composition on the Ray executor (issue 27), on a simulated two-machine cluster: the shipped
subgraph topology (incident_brief.yaml) and run-time foreach topology (plan_and_execute.yaml)
run with their handoffs crossing machines and give the local executor's outputs, lineage and
hops; and a run whose actor is killed inside the subgraph, or while the copies of the run-time
foreach run, resumes on a fresh actor to the local run's outputs.

The topologies run on a tiny random model; plan_and_execute's list comes from
tests/helpers/composition.py (three steps out of the planner's text, as in the crash tests: random
weights write no numbered lines). Needs the optional extra (make ray); skipped without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray binds loopback only, before it is imported

import anyio
import pytest

ray = pytest.importorskip("ray")

from rclc_graph import compile_plan, resume_run_sync, run_plan_sync, run_recorded  # noqa: E402
from rclc_graph.executors import DelegatingExecutor, LocalExecutor, ModelPool  # noqa: E402
from rclc_graph.executors.ray import RayExecutor  # noqa: E402
from tests.helpers.composition import shipped_on_tiny  # noqa: E402
from tests.helpers.plans import spread_reference  # noqa: E402
from tests.helpers.ray_cluster import kill_and_wait  # noqa: E402
from tests.paths import ROOT

pytestmark = pytest.mark.ray

LIMIT = 240  # seconds any one run may take before it fails instead of hanging CI

# per example: where its nodes go (so handoffs cross machines), and the node whose actor is killed
PINS = {"incident_brief": {"evidence/notes": 1}, "plan_and_execute": {"worker": 1}}
KILLED = {"incident_brief": "evidence/notes", "plan_and_execute": "worker[1]"}


def tiny_plan(name: str, source: Path):
    """The shipped topology's plan with every model (subgraphs' too) read from `source`."""
    inputs = json.loads((ROOT / "examples" / "inputs" / f"{name}.json").read_text())
    return compile_plan(shipped_on_tiny(name, source), inputs, trust_code=name == "plan_and_execute")


def assert_same_run(local, remote):
    assert remote.status == local.status == "finished", remote.error
    assert remote.outputs == local.outputs and remote.skipped == local.skipped
    for name, node in local.nodes.items():
        other = remote.nodes[name]
        assert (other.text, other.positions, other.lineage) == (node.text, node.positions, node.lineage), name
    fields = ("source", "target", "total_positions", "budget", "kept_positions", "payload_bytes", "kept_by_origin")
    for mine, theirs in zip(local.hops, remote.hops, strict=True):
        assert [getattr(theirs, f) for f in fields] == [getattr(mine, f) for f in fields]


def crossing(result) -> list:
    return [hop for hop in result.hops if hop.crossed_bytes > 0]


@pytest.mark.parametrize("name", ["incident_brief", "plan_and_execute"])
def test_composition_runs_across_machines_with_local_outputs(cluster, tiny_dir, name):
    plan = tiny_plan(name, tiny_dir)
    # incident_brief's readers sit on another machine than their fan-in: per-sender budgets there
    local = run_plan_sync(spread_reference(plan), executor=LocalExecutor(ModelPool()))
    with RayExecutor(replicas={"base": 2}, pins=PINS[name]) as executor:
        remote = run_plan_sync(plan, executor=executor)
    assert_same_run(local, remote)
    crossed = {(hop.source, hop.target) for hop in crossing(remote)}
    if name == "incident_brief":  # into the returned node on the other machine, and out of it back
        assert crossed == {(f"evidence/reader[{index}]", "evidence/notes") for index in range(3)} | {
            ("evidence/notes", "brief")}
        assert remote.nodes["evidence/notes"].placement["replica"] == "base#1"
    else:  # every copy that ran got the context's state selected for its own step, across machines
        assert crossed == {("context", f"worker[{index}]") for index in range(3)} | {
            (f"worker[{index}]", "report") for index in range(3)}  # (and their texts back to the report)
        assert set(remote.skipped) == {"worker[3]", "worker[4]"}
        assert remote.nodes["steps"].placement is None  # the function ran here, not on an actor


@pytest.mark.parametrize("name", ["incident_brief", "plan_and_execute"])
def test_an_actor_killed_inside_a_subgraph_or_a_foreach_resumes_on_a_fresh_one(cluster, tiny_dir, tmp_path, name):
    plan = tiny_plan(name, tiny_dir)
    # incident_brief's readers sit on another machine than their fan-in: per-sender budgets there
    local = run_plan_sync(spread_reference(plan), executor=LocalExecutor(ModelPool()))
    executor = RayExecutor(replicas={"base": 2}, pins=PINS[name])

    class KillDuring(DelegatingExecutor):
        """Kills replica base#1's actor once the chosen node has started (the scheduler runs
        it) and before the node reaches the actor: dead for certain on any machine."""

        async def run_node(self, ctx, node, inbound):
            if node.name == KILLED[name]:
                await anyio.to_thread.run_sync(kill_and_wait, executor.actor_of("base#1"))
            return await super().run_node(ctx, node, inbound)

    async def first_attempt():
        with anyio.fail_after(LIMIT):
            await executor.prepare(plan)  # base#1's actor is up before the node that kills it starts
            return await run_recorded(plan, tmp_path, executor=KillDuring(executor))

    try:
        failed, record, run_dir = anyio.run(first_attempt)
        assert failed.status == "failed" and "HostDied" in failed.error
        assert KILLED[name] not in record["nodes"]
    finally:
        executor.close()
    with RayExecutor(replicas={"base": 2}, pins=PINS[name]) as fresh:
        resumed, record, _ = resume_run_sync(run_dir, executor=fresh, trust_code=name == "plan_and_execute")
    assert resumed.status == "finished", resumed.error
    assert resumed.outputs == local.outputs and resumed.skipped == local.skipped
    assert KILLED[name] in record["attempts"][-1]["ran"]
    for node_name, node in local.nodes.items():
        other = resumed.nodes[node_name]
        assert (other.text, other.positions, other.lineage) == (node.text, node.positions, node.lineage), node_name
