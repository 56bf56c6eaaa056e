"""Nodes on hosts (model replicas) without Ray: several hosts in this process, handoffs between
them as bytes. Placement, the split budget fit, transports, records, dead hosts and resume
must give exactly what the local executor gives."""

from __future__ import annotations

import anyio
import pytest
import torch

from rclc.selection import Selection, Span
from rclc.state import Message
from rclc_graph import Graph, ModelPool, Policy, finished_nodes, run_recorded
from rclc_graph.executors import ExecutorUnavailable, make_executor
from rclc_graph.executors.placement import ReplicaGroup, check_pins, parse_pins
from rclc_graph.executors.transport import BytesTransport, InProcessTransport
from rclc_graph.executors import DelegatingExecutor, LocalExecutor, RunContext
from rclc_graph.run.scheduler import run_plan, run_plan_sync
from rclc_graph.spec.models import ModelSpec
from rclc_graph.testing import InProcessReplicasExecutor
from tests.paths import ROOT

WORDS = "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. " * 3


@pytest.fixture
def pool(tiny):
    model, tokenizer = tiny
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    return pool


def chain(hops: int, policy, *, replicas: int = 2):
    graph = Graph("chain").input("question").input("chunks", "list[str]")
    graph.model("base", replicas=replicas).agent("reader", model="base", max_new_tokens=3)
    for i in range(hops):
        graph.node(f"r{i}", agent="reader", prompt=f"Part {i}: {{chunks[{i}]}}", generate=False)
        if i:
            graph.edge(f"r{i - 1}", f"r{i}", policy)
    graph.node("final", agent="reader", prompt="{question}", output=True)
    graph.edge(f"r{hops - 1}", "final", policy)
    return graph.plan({"question": "Who owns Cedar?", "chunks": [WORDS] * hops})


def fan_in(policy, *, context_limit: int | None = None):
    graph = Graph("fan").input("question").input("documents", "list[str]")
    graph.model("base", replicas=2).agent("reader", model="base", max_new_tokens=3)
    graph.agent("answerer", model="base", max_new_tokens=3, context_limit=context_limit)
    graph.node("w", agent="reader", prompt="{item}", foreach="documents", generate=False)
    graph.node("final", agent="answerer", prompt="{question}", output=True)
    graph.edge("w", "final", policy)
    return graph.plan({"question": "Who owns Cedar?", "documents": [WORDS, WORDS[:90], WORDS[:150]]})


def assert_same_run(local, split):
    assert split.status == local.status == "finished", split.error
    assert split.outputs == local.outputs
    assert set(split.nodes) == set(local.nodes)
    for name, node in local.nodes.items():
        other = split.nodes[name]
        assert (other.text, other.positions, other.inherited_positions) == (node.text, node.positions, node.inherited_positions)
        assert other.lineage == node.lineage, name
    fields = ("edge", "source", "target", "total_positions", "inherited_positions", "budget", "kept_positions",
              "payload_bytes", "kept_by_origin")
    for mine, theirs in zip(local.hops, split.hops, strict=True):
        assert [getattr(theirs, f) for f in fields] == [getattr(mine, f) for f in fields]


def test_a_chain_across_hosts_equals_the_local_run(pool):
    plan = chain(3, Policy(ratio=4))
    local = run_plan_sync(plan, executor=LocalExecutor(pool))
    split = run_plan_sync(plan, executor=InProcessReplicasExecutor(pool, pins={"r1": 1, "final": 1}))
    assert_same_run(local, split)
    assert [node.placement["replica"] for node in split.nodes.values()] == ["base#0", "base#1", "base#0", "base#1"]
    for hop in split.hops:  # every hop changes host: only the selected payload crossed
        assert hop.placement["transport"] == "bytes"
        assert hop.crossed_bytes == hop.payload_bytes > 0
        assert hop.placement["sender"]["node"] != hop.placement["receiver"]["node"]
    assert all(hop.placement is None and hop.crossed_bytes == 0 for hop in local.hops)


def test_by_default_a_run_stays_on_one_replica(pool):
    split = run_plan_sync(chain(2, Policy(budget=8)), executor=InProcessReplicasExecutor(pool))
    assert {node.placement["replica"] for node in split.nodes.values()} == {"base#0"}
    assert all(hop.placement["transport"] == "in_process" and hop.crossed_bytes == 0 for hop in split.hops)


@pytest.mark.parametrize("pins", [{"w[1]": 1}, {"w": 1}, {"w[0]": 1, "w[2]": 1, "final": 0}])
def test_a_fan_in_fitted_across_hosts_keeps_what_one_transfer_keeps(pool, pins):
    # A receiver with little room: the three senders' budgets are fitted jointly (water-filling),
    # whether they sit on the receiver's host, on another one, or both. Per-sender budgets named:
    # the graph's default pools a fan-in, which needs every sender on the receiver's host
    # (across hosts it falls back to per-sender budgets; test_graph_selection).
    plan = fan_in(Policy(ratio=1, request="{question}", allocation="per_sender"), context_limit=110)
    local = run_plan_sync(plan, executor=LocalExecutor(pool))
    split = run_plan_sync(plan, executor=InProcessReplicasExecutor(pool, pins=pins))
    assert_same_run(local, split)
    assert sum(hop.budget for hop in local.hops) < sum(hop.total_positions for hop in local.hops)  # the fit bound
    assert {hop.placement["transport"] for hop in split.hops} >= {"bytes"}


def test_post_selection_reasoning_across_hosts_equals_the_local_run(pool):
    policy = Policy(budget=12, reasoning={"steps": 2, "context": "selected", "budget": 2})
    plan = chain(2, policy)
    local = run_plan_sync(plan, executor=LocalExecutor(pool))
    split = run_plan_sync(plan, executor=InProcessReplicasExecutor(pool, pins={"r1": 1}))
    assert_same_run(local, split)
    assert split.hops[0].added_latent_positions == 2


def test_full_context_reasoning_across_hosts_is_refused_by_name(pool):
    plan = chain(2, Policy(ratio=2, reasoning={"steps": 2}))
    refused = run_plan_sync(plan, executor=InProcessReplicasExecutor(pool, pins={"r1": 1}))
    assert refused.status == "failed" and refused.failed_node == "r1"
    assert "NotImplementedError" in refused.error and "full-context reasoning" in refused.error
    together = run_plan_sync(plan, executor=InProcessReplicasExecutor(pool))  # all on one host: the core does it
    assert together.status == "finished", together.error


def test_concurrent_runs_spread_over_replicas_and_free_them(pool):
    executor = InProcessReplicasExecutor(pool)
    plan = chain(2, Policy(budget=8))

    async def both():
        results = {}

        async def one(run_id):
            results[run_id] = await run_plan(plan, executor=executor, run_id=run_id)

        async with anyio.create_task_group() as group:
            group.start_soon(one, "a")
            group.start_soon(one, "b")
        return results

    results = anyio.run(both)
    replicas = {run_id: {node.placement["replica"] for node in result.nodes.values()} for run_id, result in results.items()}
    assert sorted(map(tuple, replicas.values())) == [("base#0",), ("base#1",)]
    (group,) = executor._groups.values()
    assert group.active == [0, 0]  # finished runs no longer count toward placement
    assert run_plan_sync(plan, executor=executor).nodes["final"].placement["replica"] == "base#0"


def test_a_dead_host_fails_its_receiver_and_a_resume_continues_on_a_fresh_host(pool, tmp_path):
    plan = chain(3, Policy(ratio=4))
    local = run_plan_sync(plan, executor=LocalExecutor(pool))
    executor = InProcessReplicasExecutor(pool, pins={"r1": 1, "final": 1})

    class KillAfterR1(DelegatingExecutor):
        async def run_node(self, ctx, node, inbound):
            if node.name == "r2":
                executor.kill("base#1")  # r1's state lived there
            return await super().run_node(ctx, node, inbound)

    failed, record, run_dir = anyio.run(lambda: run_recorded(plan, tmp_path, pool=pool, executor=KillAfterR1(executor)))
    assert failed.status == "failed" and failed.failed_node == "r2"
    assert "HostDied" in failed.error and "base#1" in failed.error and "'r1'" in failed.error
    assert record["nodes"]["r1"]["placement"]["replica"] == "base#1"
    started = executor.started

    resumed = anyio.run(lambda: _resume(executor, plan, run_dir))
    assert executor.started == started + 1  # one fresh host for replica base#1
    assert resumed.outputs == local.outputs
    for name in ("r2", "final"):
        assert resumed.nodes[name].lineage == local.nodes[name].lineage


async def _resume(executor, plan, run_dir):
    """What resume does: restore finished nodes where they will be hosted, then run the rest."""
    finished = finished_nodes(run_dir)
    assert set(finished) == {"r0", "r1"}
    run_id = run_dir.name
    ctx = RunContext(run_id=run_id, plan=plan, publish=None)
    for name in finished:
        agent = executor.bind(ctx, plan.node(name))
        await agent.load(run_dir / "nodes" / f"{name}.safetensors")
        executor.adopt(run_id, name, agent)
    return await run_plan(plan, executor=executor, run_id=run_id, completed=finished)


def test_transports_carry_messages_intact():
    rows = torch.randn(3, 8)
    ids = torch.tensor([5, -1, 7, -1, -1])
    selection = Selection(10, 5, (0, 2, 3, 7, 9), (Span(0, 1, True, "token", "a"), Span(1, 10, False, "continuous", None)), 1)
    message = Message(rows, ids, selection)
    plain = Message(torch.randn(4, 8))
    for transport in (BytesTransport(), InProcessTransport()):
        handle = transport.send("run", [message, plain], seconds=0.5)
        assert (handle.nbytes, handle.positions, handle.seconds) == (message.nbytes + plain.nbytes, 9, 0.5)
        first, second = anyio.run(transport.receive, handle)
        assert torch.equal(first.continuous_rows, rows) and torch.equal(first.token_ids, ids)
        assert first.selection == selection and second.selection is None
        assert torch.equal(second.continuous_rows, plain.continuous_rows)
    memory = InProcessTransport()
    handle = memory.send("run", [plain])
    memory.discard("run")
    with pytest.raises(RuntimeError, match="not held"):
        anyio.run(memory.receive, handle)


def test_placement_bookkeeping():
    group = ReplicaGroup(("k",), ModelSpec(name="base", replicas=3), None)
    assert group.choose() == 0
    group.active[0] += 1
    assert group.choose() == 1
    group.grow(2)
    assert group.size == 3
    assert parse_pins(["final=1", " reader = 0 "]) == {"final": 1, "reader": 0}
    with pytest.raises(ValueError, match="NAME=NUMBER"):
        parse_pins(["final"])
    plan = chain(2, Policy(budget=8))
    with pytest.raises(ValueError, match="not a node"):
        check_pins({"nope": 0}, plan, {"base": 2})
    with pytest.raises(ValueError, match="1 replica"):
        check_pins({"final": 1}, plan, {"base": 1})


def test_pins_to_a_missing_replica_fail_the_run_with_the_fix(pool):
    result = run_plan_sync(chain(2, Policy(budget=8), replicas=1), executor=InProcessReplicasExecutor(pool, pins={"r1": 1}))
    assert result.status == "failed" and "raise its replicas" in result.error


def test_choosing_executors_by_name(pool, monkeypatch):
    assert isinstance(make_executor("local", pool=pool), LocalExecutor)
    with pytest.raises(ValueError, match="not one of local, ray"):
        make_executor("dask")
    with pytest.raises(ValueError, match="executor ray only"):
        make_executor("local", pins={"a": 1})
    monkeypatch.setattr("rclc_graph.executors.registry.ray_available", lambda: False)
    with pytest.raises(ExecutorUnavailable, match=r"pip install -e '\.\[ray\]'"):  # issue 16 item 18: not on PyPI
        make_executor("ray")
    with pytest.raises(ExecutorUnavailable):
        run_plan_sync(chain(2, Policy(budget=8)), executor="ray")


def test_the_cli_names_the_install_when_ray_is_missing(monkeypatch, tmp_path):

    from typer.testing import CliRunner

    from rclc_graph.views.cli import app

    root = ROOT
    run = ["run", str(root / "topologies" / "fanout_qa.yaml"), "--input", str(root / "examples" / "inputs" / "fanout_qa.json"),
           "--out", str(tmp_path)]
    monkeypatch.setattr("rclc_graph.executors.registry.ray_available", lambda: False)
    missing = CliRunner().invoke(app, [*run, "--executor", "ray"])
    assert missing.exit_code == 2 and "needs Ray" in missing.stderr
    assert "pip install -e '.[ray]'" in missing.stderr and "Traceback" not in missing.output
    misplaced = CliRunner().invoke(app, [*run, "--pin", "final=1"])
    assert misplaced.exit_code == 2 and "--executor ray only" in misplaced.stderr
    malformed = CliRunner().invoke(app, [*run, "--executor", "ray", "--replicas", "base"])
    assert malformed.exit_code == 2 and "NAME=NUMBER" in malformed.stderr
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing recorded


def test_nodes_never_take_the_preparation_lock_on_the_event_loop(pool, monkeypatch):
    # A generation waits for the event loop to publish each token while it holds the attention
    # lock; an update holding the preparation lock waits for that attention lock. If the loop
    # itself waited for the preparation lock (sender_state), concurrent runs would deadlock.
    import threading

    from rclc.agent import Agent

    threads = []
    original = Agent.sender_state

    def recording(self):
        threads.append(threading.current_thread())
        return original(self)

    monkeypatch.setattr(Agent, "sender_state", recording)

    async def main():
        loop_thread = threading.current_thread()
        await run_plan(chain(2, Policy(budget=8)), executor=LocalExecutor(pool))
        return loop_thread

    loop_thread = anyio.run(main)
    assert threads and loop_thread not in threads


# issue 25 item 4: executors register by name with the options they own
def test_an_executor_registers_by_name_with_its_options(pool, monkeypatch):
    from rclc_graph.executors import ExecutorKind, ExecutorOption, check_options, executor_names, register, registry

    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))  # this test's registrations end with it
    assert executor_names()[:2] == ("local", "ray")
    register(ExecutorKind("here", "rclc_graph.executors.local:LocalExecutor", "a second in-process executor",
                          options=(ExecutorOption("max_batch", "--max-batch"),)))
    assert executor_names()[-1] == "here" and isinstance(make_executor("here", pool=pool), LocalExecutor)
    with pytest.raises(ValueError, match="registered already"):
        register(ExecutorKind("here", "x:y", "again"))
    check_options("here", {"max_batch": 4, "pins": {}, "address": None})  # unset options are no one's
    with pytest.raises(ValueError, match=r"--pin \(pins\): it applies to --executor ray only"):
        check_options("here", {"pins": {"a": 1}})
    with pytest.raises(ValueError, match=r"--max-batch \(max_batch\): it applies to --executor local only; set models"):
        check_options("ray", {"max_batch": 4})
    with pytest.raises(ValueError, match="colour: no executor takes this option"):
        make_executor("here", pool=pool, colour="blue")
