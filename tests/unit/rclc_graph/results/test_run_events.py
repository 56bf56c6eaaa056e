"""Typed run events (issue 15, item 1): one class per kind, one mapping from what the scheduler
publishes, a lossless wire form, and hop events that arrive when the receiver holds its
delivery, before it generates, with the record's figures."""

from __future__ import annotations

import anyio
import pytest

from rclc_graph import EventStream, Graph, ModelPool, Policy
from rclc_graph.results import run_events as ev
from rclc_graph.run.scheduler import run_plan
from rclc_graph.spec.models import ModelSpec
from rclc_graph.testing import FakeExecutor, InProcessReplicasExecutor
from tests.paths import ROOT

WORDS = "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. " * 2


def mixed_plan(*, replicas: int = 1, tokens: int = 3):
    """Two readers feeding a writer by state, the writer feeding a final node by text."""
    graph = Graph("mixed").input("question").input("documents", "list[str]")
    graph.model("base", replicas=replicas).agent("reader", model="base", max_new_tokens=tokens)
    graph.node("w", agent="reader", prompt="{item}", foreach="documents", generate=False)
    graph.node("writer", agent="reader", prompt="Note on {question}:")
    graph.node("final", agent="reader", prompt="{question}", output=True)
    graph.edge("w", "writer", Policy(ratio=2))
    graph.edge("writer", "final", Policy(mode="text"))
    return graph.plan({"question": "Who owns Cedar?", "documents": [WORDS, WORDS[:80]]})


def collect(plan, **options):
    events = EventStream(max_events=8)
    seen = []

    async def main():
        async with anyio.create_task_group() as group:
            async def consume():
                async for event in events:
                    seen.append(ev.typed(event))
            group.start_soon(consume)
            try:
                return await run_plan(plan, events=events, **options)
            finally:
                events.close()

    result = anyio.run(main)
    return result, seen


def assert_hops_match_the_record(result, seen):
    hops = [event for event in seen if isinstance(event, ev.HopDelivered)]
    assert len(hops) == len(result.hops)
    by_edge = {(hop.edge, hop.source): hop for hop in hops}
    for record in result.hops:
        row = record.to_dict()
        row.pop("generation_seconds")  # the receiver has not generated yet; node.finished has it
        wire = by_edge[(record.edge, record.source)].to_dict()
        assert {key: wire[key] for key in row} == row
    return hops


def assert_node_order(seen):
    """Per node: started, then its hops, then its tokens, then finished."""
    for name in {event.node for event in seen if isinstance(event, ev.NodeStarted)}:
        mine = [event for event in seen
                if getattr(event, "node", None) == name or getattr(event, "target", None) == name]
        types = [event.type for event in mine]
        assert types[0] == "node.started" and types[-1] == "node.finished", types
        hop_at = [i for i, kind in enumerate(types) if kind == "hop.delivered"]
        token_at = [i for i, kind in enumerate(types) if kind == "token"]
        if hop_at and token_at:
            assert max(hop_at) < min(token_at), types  # delivered before the first token


def test_every_published_event_is_typed_and_hops_come_before_generation_with_the_fake_executor():
    result, seen = collect(mixed_plan(), executor=FakeExecutor())
    assert result.status == "finished"
    assert seen[0].type == "run.started" and seen[-1].type == "run.finished" and seen[-1].terminal
    assert [event.seq for event in seen] == sorted(event.seq for event in seen)
    assert_node_order(seen)
    hops = assert_hops_match_the_record(result, seen)
    state = [hop for hop in hops if hop.mode == "state"]
    assert state and all(sum(segment[4] for segment in hop.kept) == hop.kept_positions for hop in state)
    finished = {event.node: event for event in seen if isinstance(event, ev.NodeFinished)}
    for name, node in result.nodes.items():
        assert finished[name].positions == node.positions
        assert finished[name].generation_seconds == node.generation_seconds
        assert finished[name].lineage == node.lineage.summary()


@pytest.fixture
def pool(tiny):
    model, tokenizer = tiny
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    return pool


def test_a_model_run_publishes_each_hop_before_the_receivers_first_token(pool):
    result, seen = collect(mixed_plan(), pool=pool)
    assert result.status == "finished", result.error
    assert_node_order(seen)
    assert_hops_match_the_record(result, seen)
    tokens = [event for event in seen if isinstance(event, ev.TokenGenerated) and event.node == "writer"]
    assert tokens and [token.index for token in tokens] == list(range(len(tokens)))


def test_replica_executors_publish_hops_with_the_records_placement(pool):
    executor = InProcessReplicasExecutor(pool)
    try:
        result, seen = collect(mixed_plan(replicas=2), executor=executor)
    finally:
        executor.close()
    assert result.status == "finished", result.error
    hops = assert_hops_match_the_record(result, seen)
    assert all(hop.placement is not None and hop.placement["receiver"] for hop in hops)
    assert_node_order(seen)


def test_a_failed_run_types_its_failure_events():
    result, seen = collect(mixed_plan(), executor=FakeExecutor(fail={"writer"}))
    assert result.status == "failed"
    failure = next(event for event in seen if isinstance(event, ev.NodeFailure))
    assert failure.node == "writer" and "writer broke" in failure.message
    assert seen[-1].type == "run.failed" and seen[-1].node == "writer" and "writer broke" in seen[-1].error


CONTRACT = [  # /work/coord/events_contract.md: the payloads issue 13 publishes
    ("node", {"node": "n", "status": "skipped", "reason": "no edge fired"}, ev.NodeSkipped),
    ("node", {"node": "n", "status": "waiting", "question": "OK?"}, ev.NodeWaiting),
    ("run", {"status": "waiting", "node": "n", "question": "OK?"}, ev.RunWaiting),
    ("edge", {"edge": 3, "source": "a", "target": "b", "fired": False}, ev.EdgeDecided),
    ("tool", {"node": "n", "phase": "call", "call_id": "c1", "name": "sql", "arguments": {"q": 1}}, ev.ToolCalled),
    ("tool", {"node": "n", "phase": "result", "call_id": "c1", "name": "sql", "result": [1], "error": None},
     ev.ToolReturned),
    ("cancelled", {"finished": ["a"]}, ev.RunCancelled),
    ("token", {"node": "n", "index": 0, "text": "Hi"}, ev.TokenGenerated),
]


@pytest.mark.parametrize(("kind", "payload", "cls"), CONTRACT, ids=[cls.type for _, _, cls in CONTRACT])
def test_contract_payloads_map_to_their_types_and_round_trip(kind, payload, cls):
    event = ev.typed_from(kind, payload, run_id="r1", seq=7)
    assert type(event) is cls and event.run_id == "r1" and event.seq == 7
    wire = event.to_dict()
    assert wire["type"] == cls.type and ev.event_from_dict(wire) == event
    assert event.terminal == (cls.type in ev.TERMINAL_TYPES)


def test_fields_a_class_does_not_declare_are_kept_and_written_back():
    event = ev.typed_from("node", {"node": "n", "status": "started", "replica": "base#1"}, run_id="r", seq=1)
    assert event.extra == {"replica": "base#1"} and event.to_dict()["replica"] == "base#1"
    assert ev.event_from_dict(event.to_dict()) == event


@pytest.mark.parametrize(("kind", "payload", "message"), [
    ("gossip", {}, "kind: 'gossip' is not a run event kind"),
    ("node", {"node": "n", "status": "dozing"}, "node event: status 'dozing'"),
    ("tool", {"node": "n", "phase": "maybe"}, "tool event: phase 'maybe'"),
    ("token", {"node": "n", "index": 0}, "token event: missing text"),
])
def test_unknown_kinds_statuses_and_missing_fields_are_named(kind, payload, message):
    with pytest.raises(ValueError, match=message):
        ev.typed_from(kind, payload, run_id="r", seq=1)


def test_every_type_is_documented_in_streaming_md():
    text = (ROOT / "docs" / "streaming.md").read_text(encoding="utf-8")
    for name, cls in ev.EVENT_TYPES.items():
        assert f"`{name}`" in text and cls.__name__ in text, name


# issue 25 item 2: one definition of a hop; the event, the record rows and the shape check are HopRecord's fields
def test_a_hop_event_is_the_hop_record_and_nothing_lands_in_extra():
    import dataclasses

    from rclc_graph.results.lineage import HopRecord, Lineage, compose_hop
    from rclc_graph.run.record.shape import check_record

    hop = compose_hop(Lineage.fresh("a", 6), [0, 2, 3], source="a", target="b", inherited_positions=0, budget=3,
                      policy="b3", edge=4, excluded_by_reason={"template": 2}, allocation="pooled", fitted_budget=2)
    event = ev.typed_from("hop", ev.hop_payload(hop), run_id="r", seq=3)
    assert isinstance(event, ev.HopDelivered) and event.extra == {} and event.hop == hop.record
    assert (event.source, event.allocation, event.excluded_by_reason) == ("a", "pooled", {"template": 2})
    wire = event.to_dict()
    names = [item.name for item in dataclasses.fields(HopRecord) if item.name not in ("generation_seconds", "bridge")]
    assert list(wire) == ["type", "run_id", "seq", *names, "kept"] and ev.event_from_dict(wire) == event
    # a bridged hop carries its bridge's text; one without a bridge has no such field (above)
    bridged = dataclasses.replace(hop, record=dataclasses.replace(hop.record, bridge="Lynx agency belongs Jonas"))
    again = ev.typed_from("hop", ev.hop_payload(bridged), run_id="r", seq=4)
    assert again.bridge == "Lynx agency belongs Jonas" and ev.event_from_dict(again.to_dict()) == again
    assert HopRecord.from_dict(hop.record.to_dict()) == hop.record
    with pytest.raises(ValueError, match="hop: missing budget; unknown budgett"):
        HopRecord.from_dict({**{k: v for k, v in hop.record.to_dict().items() if k != "budget"}, "budgett": 3})
    row = {**hop.record.to_dict(), "allocation": 7}  # a field the old shape check did not know is checked now
    with pytest.raises(ValueError, match=r"hops\[0\]\.allocation is 7, expected text"):
        check_record({"status": "finished", "run_id": "r", "graph": "g", "error": None, "hops": [row]})
