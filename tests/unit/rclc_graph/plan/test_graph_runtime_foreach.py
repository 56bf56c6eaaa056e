"""Run-time foreach (plan/runtime_foreach.py): a node copied per item of the JSON list an
earlier node writes, decided when that node finished (LangGraph's `Send`).

Validation (the producer, loops, cycles, bounds, pairing), planning (max_items copies that
wait for the producer), reading the list (what counts as one, and the clear errors for what
does not) and runs: copies get their items in prompts, requests and function inputs, copies
past the list's end are skipped, fan-in reads only the copies that ran, a bad list fails the
copy naming the producer, and the remote executor path carries the item to its replica."""

from __future__ import annotations

import json

import pytest

from rclc_graph import Graph, GraphError, ModelPool, Policy, run_plan_sync, run_recorded_sync
from rclc_graph.errors import UsageError
from rclc_graph.plan.runtime_foreach import read_items
from rclc_graph.render.html_report import render_report
from rclc_graph.spec.models import ModelSpec
from rclc_graph.testing import FakeExecutor, InProcessReplicasExecutor, NodeReading

TEXT = Policy(mode="text")


def graph(max_items: int = 4, *, policy=TEXT, worker_prompt: str = "Step: {item} ({index})") -> Graph:
    built = Graph("plan_and_do").input("goal").model("base").agent("a", model="base", max_new_tokens=4)
    built.node("planner", agent="a", prompt="Plan steps for {goal} as a JSON list.")
    built.node("worker", agent="a", foreach={"node": "planner", "max_items": max_items}, prompt=worker_prompt)
    built.node("final", agent="a", output=True, prompt="Report on {goal}.")
    built.edge("worker", "final", policy)
    return built


def writer(planned: str):
    """Fake texts: the planner writes `planned`; every other node names what it read."""
    def text(reading: NodeReading) -> str:
        if reading.node.declared == "planner":
            return planned
        return f"{reading.node.name} did {reading.node.prompt!r}"
    return text


def refused(build) -> GraphError:
    with pytest.raises(GraphError) as caught:
        build().validate()
    return caught.value


# -- validation and planning -------------------------------------------------------------------------


def test_an_unknown_producer_is_named_with_a_suggestion():
    def build():
        built = graph()
        built._nodes[1] = built._nodes[1].model_copy(update={"foreach": built._nodes[1].foreach.model_copy(
            update={"node": "planer"})})
        return built
    error = refused(build)
    assert error.code == "E_UNKNOWN_REF" and error.path == ("nodes", 1, "foreach", "node") and "planner" in error.fix


@pytest.mark.parametrize("max_items", [0, 257])
def test_max_items_is_bounded(max_items):
    with pytest.raises(GraphError) as caught:
        graph(max_items)
    assert caught.value.path == ("nodes", 1, "foreach", "max_items")


def test_a_producer_with_copies_or_without_text_is_refused():
    def copied():
        built = graph().input("goals", "list[str]")
        built._nodes[0] = built._nodes[0].model_copy(update={"foreach": "goals"})
        return built
    assert refused(copied).code == "E_FOREACH" and "the list must come from one node" in refused(copied).message

    def silent():
        built = graph()
        built._nodes[0] = built._nodes[0].model_copy(update={"generate": False})
        return built
    assert "writes no text" in refused(silent).message


def test_a_run_time_foreach_in_a_loop_or_closing_a_cycle_is_refused():
    def looped():
        return graph().edge("worker", "planner", TEXT, rounds=2)
    assert refused(looped).code == "E_FOREACH" and "sits in a loop" in refused(looped).message

    def cycle():
        return graph().edge("worker", "planner", TEXT)
    error = refused(cycle)
    assert error.code == "E_CYCLE" and "waits for the node it ranges over" in error.message


def test_copies_pair_only_over_the_same_run_time_list():
    def mixed():
        built = graph().input("docs", "list[str]")
        built.node("reader", agent="a", foreach="docs", prompt="{item}")
        return built.edge("reader", "worker", TEXT)
    assert refused(mixed).code == "E_FOREACH"
    paired = graph()
    paired.node("check", agent="a", foreach={"node": "planner", "max_items": 4}, prompt="Check {item}")
    paired.edge("worker", "check", TEXT).edge("check", "final", TEXT)
    plan = paired.plan({"goal": "g"})
    assert [(edge.source, edge.target) for edge in plan.edges if edge.target.startswith("check")] == [
        (f"worker[{i}]", f"check[{i}]") for i in range(4)]


def test_the_plan_holds_max_items_copies_waiting_for_the_producer():
    plan = graph(3).plan({"goal": "g"})
    assert plan.order == ("planner", "worker[0]", "worker[1]", "worker[2]", "final")
    assert {plan.node(f"worker[{i}]").foreach_from for i in range(3)} == {"planner"}
    assert plan.ready(settled=()) == ("planner",)  # no edge joins them, yet the copies wait
    assert plan.ready(settled=("planner",)) == ("worker[0]", "worker[1]", "worker[2]")
    assert plan.levels() == (("planner",), ("worker[0]", "worker[1]", "worker[2]"), ("final",))
    assert plan.node("worker[1]").prompt == "Step:  (1)" and plan.node("worker[1]").item is None


# -- reading the list --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, items", [
    ('["a", "b"]', ["a", "b"]),
    ('Here is the plan:\n```json\n["check the pool", "roll back"]\n```', ["check the pool", "roll back"]),
    ("[]", []),
])
def test_lists_are_read_from_the_output_or_the_first_json_list_in_it(text, items):
    assert read_items(text, "planner", "worker", 4) == items


@pytest.mark.parametrize("text, words", [
    ("no list here", "found no JSON value"),
    ('{"steps": ["a"]}', "found a JSON object"),
    ('["a", "b", "c", "d", "e"]', "the list has 5 items, more than max_items 4"),
    ('["a", 2]', "item 1 is a JSON number"),
    ('["a", {"b": 1}]', "item 1 is a JSON object"),
    ('["a", " "]', "item 1 is empty"),
])
def test_bad_lists_say_what_is_wrong(text, words):
    with pytest.raises(UsageError, match=words) as caught:
        read_items(text, "planner", "worker", 4)
    assert "foreach of node worker over the output of planner" in str(caught.value)


# -- runs ----------------------------------------------------------------------------------------------


def test_copies_run_with_their_items_and_the_rest_are_skipped(tmp_path):
    executor = FakeExecutor(text=writer('["check the pool", "roll back"]'))
    result, record, _ = run_recorded_sync(graph().plan({"goal": "g"}), tmp_path, executor=executor)
    assert result.status == "finished", result.error
    assert result.nodes["worker[0]"].text == "worker[0] did 'Step: check the pool (0)'"
    assert result.nodes["worker[1]"].text == "worker[1] did 'Step: roll back (1)'"
    assert result.skipped == {"worker[2]": "planner's list has 2 items", "worker[3]": "planner's list has 2 items"}
    assert [hop.source for hop in result.nodes["final"].hops] == ["worker[0]", "worker[1]"]
    assert [node["foreach_from"] for node in record["plan"]["nodes"]][1:3] == ["planner", "planner"]
    page = render_report(record)
    assert "<h2>Run-time foreach</h2>" in page and "worker[0], worker[1]" in page


def test_an_empty_list_skips_every_copy_and_what_only_they_feed():
    result = run_plan_sync(graph().plan({"goal": "g"}), executor=FakeExecutor(text=writer("[]")))
    assert result.status == "finished" and set(result.skipped) == {f"worker[{i}]" for i in range(4)} | {"final"}
    assert result.outputs == {}


@pytest.mark.parametrize("planned, words", [
    ("I could not plan that.", "expected a JSON list of strings, found no JSON value"),
    (json.dumps([f"step {i}" for i in range(6)]), "the list has 6 items, more than max_items 4"),
])
def test_a_bad_list_fails_the_copy_and_names_the_producer(planned, words):
    result = run_plan_sync(graph().plan({"goal": "g"}), executor=FakeExecutor(text=writer(planned)))
    assert result.status == "failed" and result.failed_node == "worker[0]"
    assert words in result.error and "over the output of planner" in result.error


def test_requests_read_the_item_too():
    seen = {}

    def text(reading: NodeReading) -> str:
        for edge, _ in reading.inbound:
            seen[edge.target] = edge.request
        return writer('["alpha", "beta"]')(reading)

    built = graph(2, policy=Policy(ratio=2))  # state out of the copies: the fan-in inherits from each
    built.edge("planner", "worker", Policy(ratio=2, request="Plan for {item}"))
    result = run_plan_sync(built.plan({"goal": "g"}), executor=FakeExecutor(text=text))
    assert result.status == "finished", result.error
    assert seen["worker[0]"] == "Plan for alpha" and seen["worker[1]"] == "Plan for beta"
    by_node = result.nodes["final"].lineage.summary()["by_node"]
    assert by_node["worker[0]"] > 0 and by_node["worker[1]"] > 0 and "worker[2]" not in by_node


def record_item(inputs, senders):
    return f"{inputs['index']}={inputs['step']}"


def test_function_copies_receive_their_item():
    built = Graph("fn").input("goal").model("base").agent("a", model="base")
    built.node("planner", agent="a", prompt="Plan {goal}")
    built.function("do", record_item, foreach={"node": "planner", "max_items": 3}, item="step", output=True)
    result = run_plan_sync(built.plan({"goal": "g"}), executor=FakeExecutor(text=writer('["x", "y"]')))
    assert result.outputs == {"do[0]": "0=x", "do[1]": "1=y"}


def test_a_skipped_producer_skips_its_copies():
    built = graph(2)
    built.node("gate", agent="a", prompt="Gate {goal}")
    built.edge("gate", "planner", TEXT, when={"contains": "go"})
    result = run_plan_sync(built.plan({"goal": "g"}), executor=FakeExecutor(text=writer('["a"]')))
    assert result.skipped["worker[0]"] == "planner was skipped, so there is no list to range over"


def test_replicas_receive_each_copy_with_its_item(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    built = Graph("replicated").input("goal").model("base").agent("a", model="base", max_new_tokens=3)
    built.function("planner", plan_two)
    built.node("worker", agent="a", foreach={"node": "planner", "max_items": 3}, prompt="Do {item}.")
    built.node("final", agent="a", output=True, prompt="Done with {goal}?")
    built.edge("worker", "final", Policy(ratio=2))
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    executor = InProcessReplicasExecutor(pool, replicas={"base": 2})
    try:
        result = run_plan_sync(built.plan({"goal": "g"}), executor=executor)
    finally:
        executor.close()
    assert result.status == "finished", result.error
    assert "Do first." in result.nodes["worker[0]"].prompt_text and "Do second." in result.nodes["worker[1]"].prompt_text
    assert "worker[2]" in result.skipped and result.nodes["final"].inherited_positions > 0


def plan_two(inputs, senders):
    return ["first", "second"]


def test_a_subgraph_node_may_write_the_list():
    child = Graph("lister").input("goal").model("base").agent("a", model="base")
    child.node("write", agent="a", output=True, prompt="List steps for {goal}")
    built = Graph("outer").input("goal").model("base").agent("a", model="base")
    built.subgraph("planning", child)
    built.node("worker", agent="a", foreach={"node": "planning", "max_items": 2}, prompt="Do {item}", output=True)
    plan = built.plan({"goal": "g"})
    assert plan.node("worker[0]").foreach_from == "planning/write"

    def text(reading: NodeReading) -> str:
        return '["x"]' if reading.node.name == "planning/write" else f"did {reading.node.prompt}"

    result = run_plan_sync(plan, executor=FakeExecutor(text=text))
    assert result.outputs == {"worker[0]": "did Do x"} and "worker[1]" in result.skipped
