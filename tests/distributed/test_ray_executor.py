"""The Ray executor on a simulated two-machine cluster (ray.cluster_utils.Cluster, one CPU each).

The topology files run unchanged; a run option gives the model two replicas and pins nodes to
them, so handoffs cross machines. Outputs, lineage and hop figures must equal the local
executor's. Also: an actor killed mid-run, then a resume on a fresh actor; cancellation; the
CLI. Needs the optional extra (pip install -e '.[ray]', make ray); skipped without it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray binds loopback only, before it is imported

import anyio
import pytest

ray = pytest.importorskip("ray")

from rclc_graph import EventStream, finished_nodes, plan_file, run_plan, run_plan_sync, run_recorded, typed  # noqa: E402
from rclc_graph.executors.ray import RayExecutor  # noqa: E402
from rclc_graph.spec.load import read_graph  # noqa: E402
from rclc_graph.plan.compile import compile_plan  # noqa: E402
from rclc_graph.executors import DelegatingExecutor, LocalExecutor, ModelPool, RunContext  # noqa: E402
from tests.helpers.plans import spread_reference  # noqa: E402
from tests.helpers.ray_cluster import kill_and_wait  # noqa: E402
from tests.paths import ROOT

pytestmark = pytest.mark.ray

CHAIN = ROOT / "topologies" / "chain_of_agents.yaml"
FANOUT = ROOT / "topologies" / "fanout_qa.yaml"
LIMIT = 240  # seconds any one test may take before it fails instead of hanging CI


def inputs(name: str) -> dict:
    return json.loads((ROOT / "examples" / "inputs" / f"{name}.json").read_text())


def on_model(path: Path, source: Path, data: dict, **agent_updates):
    """The topology file's plan with its model read from `source` (tiny tests)."""
    spec = read_graph(path).spec
    models = [model.model_copy(update={"source": str(source)}) for model in spec.models]
    agents = [agent.model_copy(update=agent_updates) for agent in spec.agents]
    return compile_plan(spec.model_copy(update={"models": models, "agents": agents}), data)


def assert_same_run(local, remote):
    assert remote.status == local.status == "finished", remote.error
    assert remote.outputs == local.outputs
    for name, node in local.nodes.items():
        other = remote.nodes[name]
        assert (other.text, other.positions, other.lineage) == (node.text, node.positions, node.lineage), name
    fields = ("source", "target", "total_positions", "budget", "kept_positions", "payload_bytes", "kept_by_origin")
    for mine, theirs in zip(local.hops, remote.hops, strict=True):
        assert [getattr(theirs, f) for f in fields] == [getattr(mine, f) for f in fields]


def crossing(result) -> list:
    return [hop for hop in result.hops if hop.crossed_bytes > 0]


@pytest.mark.integration
def test_chain_of_agents_runs_unchanged_across_machines(cluster):
    plan = plan_file(CHAIN, inputs("chain_of_agents"))
    local = run_plan_sync(plan, executor=LocalExecutor(ModelPool()))
    # Alternate replicas along the chain: every handoff leaves its machine.
    with RayExecutor(replicas={"base": 2}, pins={"reader_2": 1, "reader_4": 1}) as executor:
        remote = run_plan_sync(plan, executor=executor)
    assert_same_run(local, remote)
    assert len(crossing(remote)) == 4
    for hop in remote.hops:
        assert hop.placement["transport"] == "object_store"
        assert hop.placement["sender"]["node"] != hop.placement["receiver"]["node"]
        assert hop.crossed_bytes == hop.payload_bytes
    assert {node.placement["replica"] for node in remote.nodes.values()} == {"base#0", "base#1"}


@pytest.mark.integration
def test_fanout_qa_fits_remote_senders_jointly_and_streams_tokens(cluster):
    plan = plan_file(FANOUT, inputs("fanout_qa"))
    # the readers sit on another machine than final: the default's pooling becomes per-sender budgets
    local = run_plan_sync(spread_reference(plan), executor=LocalExecutor(ModelPool()))

    async def run_with_events(executor):
        events = EventStream()
        seen = []

        async def consume():
            async for event in events:
                seen.append(typed(event))

        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            with anyio.fail_after(LIMIT):
                result = await run_plan(plan, executor=executor, events=events)
            events.close()
        return result, seen

    with RayExecutor(replicas={"base": 2}, pins={"final": 1}) as executor:
        remote, seen = anyio.run(run_with_events, executor)
    assert_same_run(local, remote)
    assert len(crossing(remote)) == 3  # three readers on one machine, the answer on the other
    tokens = [event for event in seen if event.type == "token"]
    assert len(tokens) == remote.nodes["final"].generated_tokens > 0
    # issue 15: each hop arrives from the actor when final holds it, before its first token,
    # with the placement and crossed bytes the record's row has
    kinds = [event.type for event in seen]
    hops = [event for event in seen if event.type == "hop.delivered"]
    assert len(hops) == 3 and max(i for i, kind in enumerate(kinds) if kind == "hop.delivered") < kinds.index("token")
    for hop, record in zip(hops, remote.hops, strict=True):
        assert hop.placement == record.placement and hop.crossed_bytes == record.crossed_bytes > 0


def test_a_killed_actor_fails_its_node_and_a_resume_continues_on_a_fresh_actor(cluster, tiny_dir, tmp_path):
    plan = on_model(CHAIN, tiny_dir, inputs("chain_of_agents"), max_new_tokens=8)
    local = run_plan_sync(plan, executor=LocalExecutor(ModelPool()))
    executor = RayExecutor(replicas={"base": 2}, pins={"reader_2": 1, "reader_3": 1})

    class KillDuringReader3(DelegatingExecutor):
        """Kills replica base#1's actor once reader_3 has started (the scheduler runs it) and
        before the node reaches the actor: dead for certain, whatever the machine's speed."""

        async def run_node(self, ctx, node, inbound):
            if node.name == "reader_3":
                await anyio.to_thread.run_sync(kill_and_wait, executor.actor_of("base#1"))
            return await super().run_node(ctx, node, inbound)

    async def first_attempt():
        with anyio.fail_after(LIMIT):
            return await run_recorded(plan, tmp_path, executor=KillDuringReader3(executor))

    try:
        failed, record, run_dir = anyio.run(first_attempt)
        assert failed.status == "failed" and failed.failed_node == "reader_3"
        assert "HostDied" in failed.error and "base#1" in failed.error and "killed" in failed.error
        assert record["nodes"]["reader_2"]["placement"]["replica"] == "base#1"
        started = executor.started

        async def resume():
            done = finished_nodes(run_dir)
            assert set(done) == {"reader_1", "reader_2"}
            ctx = RunContext(run_id=run_dir.name, plan=plan, publish=None)
            for name in done:  # restored on the actor that will host the node (a fresh one for base#1)
                agent = executor.bind(ctx, plan.node(name))
                await agent.load(run_dir / "nodes" / f"{name}.safetensors")
                executor.adopt(run_dir.name, name, agent)
            with anyio.fail_after(LIMIT):
                return await run_plan(plan, executor=executor, run_id=run_dir.name, completed=done)

        resumed = anyio.run(resume)
        assert executor.started == started + 1  # a fresh actor for base#1
        assert resumed.status == "finished", resumed.error
        assert resumed.outputs == local.outputs
        for name in ("reader_3", "reader_4", "final"):
            assert resumed.nodes[name].lineage == local.nodes[name].lineage
        assert resumed.nodes["reader_3"].placement["actor"] != record["nodes"]["reader_2"]["placement"]["actor"]
    finally:
        executor.close()


def test_cancelling_a_run_stops_generation_on_the_actor(cluster, tiny_dir):
    from rclc_graph import Graph

    graph = Graph("long").input("question")
    graph.model("base", str(tiny_dir)).agent("talker", model="base", max_new_tokens=3000)
    graph.node("a", agent="talker", prompt="{question}", output=True)
    plan = graph.plan({"question": "Say a lot."})
    with RayExecutor() as executor:
        anyio.run(executor.prepare, plan)

        async def main():
            events = EventStream()
            tokens = []
            scope = anyio.CancelScope()

            async def consume():
                async for event in events:
                    if event.kind == "token":
                        tokens.append(event)
                        if len(tokens) == 5:
                            scope.cancel()  # mid-generation: thousands of tokens to go
                    if event.kind == "cancelled":
                        return

            async with anyio.create_task_group() as group:
                group.start_soon(consume)
                with scope, anyio.fail_after(LIMIT):
                    await run_plan(plan, executor=executor, events=events)
                cancelled_at = time.monotonic()
                if not scope.cancelled_caught:
                    events.close()
            return tokens, scope.cancelled_caught, cancelled_at

        tokens, cancelled, cancelled_at = anyio.run(main)
        assert cancelled, "the run ended before it was cancelled; the test cancelled nothing"
        actor = executor.actor_of("base#0")
        while ray.get(actor.describe.remote())["running"]:  # the actor-side node ends at its next step
            # a hang guard, not a speed claim: the bounded token count below is what shows the stop
            assert time.monotonic() - cancelled_at < 600, "generation went on after the run was cancelled"
            time.sleep(0.05)
        assert len(tokens) < 3000


@pytest.mark.integration
def test_the_cli_runs_a_topology_on_ray(cluster, tmp_path):
    from typer.testing import CliRunner

    from rclc_graph.views.cli import app

    result = CliRunner().invoke(app, [
        "run", str(FANOUT), "--input", str(ROOT / "examples" / "inputs" / "fanout_qa.json"), "--out", str(tmp_path),
        "--json", "--executor", "ray", "--address", cluster.address, "--replicas", "base=2", "--pin", "final=1",
    ])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished"
    assert all(hop["crossed_bytes"] == hop["payload_bytes"] > 0 for hop in summary["hops"])
    assert ray.is_initialized()  # the CLI joined the test's cluster and left it running


# -- routing, loops that stop, function nodes (issue 13) --------------------------------------

TRIAGE = ROOT / "topologies" / "triage.yaml"
REVIEW = ROOT / "topologies" / "review_loop.yaml"


def assert_same_steering(local, remote):
    assert remote.status == local.status, remote.error
    assert remote.outputs == local.outputs and remote.skipped == local.skipped and remote.fired == local.fired
    assert remote.waiting == local.waiting
    for name, node in local.nodes.items():
        other = remote.nodes[name]
        assert (other.text, other.positions, other.lineage, other.kind) == (node.text, node.positions, node.lineage,
                                                                             node.kind), name


@pytest.mark.integration
def test_triage_routes_on_ray_as_it_does_locally(cluster):
    for message in ("I was charged twice for my subscription this month.", "The app crashes when I open settings."):
        plan = plan_file(TRIAGE, {"message": message})
        local = run_plan_sync(plan, executor=LocalExecutor(ModelPool()))
        with RayExecutor(replicas={"base": 2}, pins={"triage": 1}) as executor:
            remote = run_plan_sync(plan, executor=executor)  # the specialist reads triage's state across machines
        assert_same_steering(local, remote)
        assert len(remote.skipped) == 1 and len(crossing(remote)) == 1


def test_triage_on_a_tiny_model_routes_and_skips_on_ray(cluster, tiny_dir):
    plan = on_model(TRIAGE, tiny_dir, {"message": "My invoice is wrong."}, max_new_tokens=6)
    local = run_plan_sync(plan, executor=LocalExecutor(ModelPool()))
    with RayExecutor(replicas={"base": 2}, pins={"triage": 1}) as executor:
        remote = run_plan_sync(plan, executor=executor)
    assert_same_steering(local, remote)
    assert len(remote.skipped) == 1


def classify(inputs, senders):
    """A rule on the scheduler's side: which specialist gets the message."""
    return {"route": "billing" if "invoice" in inputs["message"] else "technical", "pid": os.getpid()}


def test_function_nodes_and_a_stopping_loop_run_on_ray_with_local_outputs(cluster, tiny_dir):
    from rclc_graph import Graph, Policy

    text = Policy(mode="text")
    graph = Graph("steered").input("message")
    graph.model("base", str(tiny_dir)).agent("a", model="base", max_new_tokens=5)
    graph.function("classify", classify)
    graph.node("billing", agent="a", prompt="{message} billing", output=True)
    graph.node("technical", agent="a", prompt="{message} technical", output=True)
    graph.node("writer", agent="a", prompt="{message} round {round}")
    graph.node("critic", agent="a", prompt="Review:")
    graph.node("final", agent="a", prompt="Final:", output=True)
    graph.edge("classify", "billing", text, when={"json": {"path": "route", "equals": "billing"}})
    graph.edge("classify", "technical", text, when={"json": {"path": "route", "equals": "technical"}})
    graph.edge("billing", "writer", text)
    graph.edge("writer", "critic", Policy(ratio=2))
    graph.edge("critic", "writer", Policy(ratio=2), rounds=3, until={"matches": "(?s)."})  # stops after round 1
    graph.edge("writer", "final", text)
    graph.edge("critic", "final", text)
    plan = graph.plan({"message": "My invoice is wrong."})
    local = run_plan_sync(plan, executor=LocalExecutor(ModelPool()))
    with RayExecutor(replicas={"base": 2}, pins={"critic": 1}) as executor:
        remote = run_plan_sync(plan, executor=executor)
    assert remote.nodes["classify"].placement is None  # ran here, not on an actor
    assert json.loads(remote.nodes["classify"].text)["pid"] == os.getpid()
    assert_same_steering(local, remote)
    assert set(remote.skipped) == {"technical", "writer@2", "critic@2", "writer@3", "critic@3"}
    assert crossing(remote)  # writer@1 -> critic@1 crossed machines


def test_a_run_waiting_on_ray_resumed_there_with_an_answer_equals_local_answered_up_front(cluster, tiny_dir, tmp_path):
    """Interrupts on Ray: the run stops before `review` (on the other machine), a resume on Ray
    restores `draft`'s snapshot onto an actor and hands its state across with the answer."""
    from rclc_graph import Graph, Policy, resume_run_sync

    graph = Graph("approval").input("topic")
    graph.model("base", str(tiny_dir)).agent("a", model="base", max_new_tokens=5)
    graph.node("draft", agent="a", prompt="Write about {topic}:")
    graph.node("review", agent="a", prompt="Reviewer's notes: {answer}\nRevise:", output=True, interrupt="before")
    graph.edge("draft", "review", Policy(ratio=2))
    data = {"topic": "tides"}
    local = run_plan_sync(graph.plan(data, answers={"review": "shorter"}), executor=LocalExecutor(ModelPool()))
    assert local.status == "finished", local.error

    async def first_attempt(executor):
        with anyio.fail_after(LIMIT):
            return await run_recorded(graph.plan(data), tmp_path, executor=executor)

    with RayExecutor(replicas={"base": 2}, pins={"draft": 0, "review": 1}) as executor:
        waiting, record, run_dir = anyio.run(first_attempt, executor)
    assert waiting.status == "waiting" and [item["node"] for item in waiting.waiting] == ["review"]
    assert not record.get("skipped") and "review" not in record["nodes"]
    with RayExecutor(replicas={"base": 2}, pins={"draft": 0, "review": 1}) as executor:
        resumed, record, _ = resume_run_sync(run_dir, answers={"review": "shorter"}, executor=executor)
    assert resumed.status == "finished", resumed.error
    assert record["attempts"][-1]["ran"] == ["review"]  # draft was restored, not run again
    assert resumed.outputs == local.outputs
    for name in ("draft", "review"):
        mine, theirs = local.nodes[name], resumed.nodes[name]
        assert (theirs.text, theirs.positions, theirs.lineage) == (mine.text, mine.positions, mine.lineage), name
    assert crossing(resumed)  # draft's state reached review on the other machine
