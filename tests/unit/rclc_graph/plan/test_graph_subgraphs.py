"""Subgraphs (plan/subgraphs.py, plan/splice.py): a node that runs another topology whole.

Loading (files relative to the file naming them, cycles and paths outside the tree refused),
validation (fields, inputs, returns, models, and edges checked against the entry and returned
nodes they really meet, every problem placed under the subgraph node with its own file and
line), planning (nodes `sub/node`, copies and rounds of the subgraph node, nesting), and runs:
outputs under the subgraph node's name, lineage across the boundary, function nodes reading
the subgraph's inputs, a person's answer inside a subgraph, failures naming the path, records
and the report."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from rclc_graph import (
    Graph,
    GraphError,
    LocalExecutor,
    ModelPool,
    Policy,
    load_graph,
    plan_file,
    resume_run_sync,
    run_plan_sync,
    run_recorded_sync,
    validate_file,
)
from rclc_graph.render.html_report import render_report
from rclc_graph.spec.models import GraphSpec, ModelSpec
from rclc_graph.testing import FakeExecutor, NodeReading

TEXT = Policy(mode="text")

CHILD = """\
version: 1
name: research
inputs:
  topic: str
  notes: list[str]
models:
  - {name: base, source: embedded}
agents:
  - {name: reader, model: base, max_new_tokens: 4}
  - {name: writer, model: base, max_new_tokens: 4}
nodes:
  - {name: reader, agent: reader, foreach: notes, item: note, generate: false, prompt: "About {topic}: {note}"}
  - {name: summary, agent: writer, output: true, prompt: "Summarise what you read about {topic}."}
edges:
  - {source: reader, target: summary, policy: {ratio: 2}}
"""

PARENT = """\
version: 1
name: review
inputs:
  question: str
  reports: list[str]
models:
  - {name: base, source: embedded}
agents:
  - {name: a, model: base, max_new_tokens: 4}
nodes:
  - {name: intro, agent: a, generate: false, prompt: "Question: {question}"}
  - {name: research, graph: parts/research.yaml, inputs: {topic: "{question}", notes: "{reports}"}}
  - {name: final, agent: a, output: true, prompt: "Answer: {question}"}
edges:
  - {source: intro, target: research}
  - {source: research, target: final}
"""

INPUTS = {"question": "what broke?", "reports": ["the pool ran dry", "a deploy lowered it"]}


def write(directory: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return directory / next(iter(files))


def refused(call, *args, **kwargs) -> GraphError:
    with pytest.raises(GraphError) as caught:
        call(*args, **kwargs)
    return caught.value


# -- loading ---------------------------------------------------------------------------------------


def test_a_subgraph_file_is_read_relative_to_the_file_naming_it_and_planned_in_place(tmp_path):
    path = write(tmp_path / "topologies", {"review.yaml": PARENT, "parts/research.yaml": CHILD})
    spec = load_graph(path)
    assert isinstance(spec.nodes[1].graph, GraphSpec) and spec.nodes[1].graph.name == "research"
    plan = plan_file(path, INPUTS)
    assert plan.order == ("intro", "research/reader[0]", "research/reader[1]", "research/summary", "final")
    # the inbound edge reaches the subgraph's entry nodes; the outbound one leaves from its returned node
    assert [(edge.source, edge.target) for edge in plan.edges[:3]] == [
        ("intro", "research/reader[0]"), ("intro", "research/reader[1]"), ("research/summary", "final")]
    summary = plan.node("research/summary")
    assert summary.scope == "research" and summary.declared == "research/summary"
    assert summary.prompt == "Summarise what you read about what broke?."
    assert plan.node("research/reader[1]").prompt == "About what broke?: a deploy lowered it"
    assert summary.spec_path == ("nodes", 1, "graph", "nodes", 1)
    scope = plan.scopes["research"]
    assert scope.inputs == {"topic": "what broke?", "notes": ("the pool ran dry", "a deploy lowered it")}
    assert scope.returns == "research/summary" and scope.entries == ("research/reader[0]", "research/reader[1]")
    assert plan.describe()["subgraphs"][0]["graph"] == "research"


def test_files_that_run_each_other_are_refused_with_the_chain(tmp_path):
    loop = "version: 1\nname: {name}\nnodes:\n  - {{name: s, graph: {other}}}\n"
    path = write(tmp_path / "t", {"a.yaml": loop.format(name="a", other="sub/b.yaml"),
                                  "sub/b.yaml": loop.format(name="b", other="../a.yaml")})
    error = refused(load_graph, path)
    assert error.code == "E_SUBGRAPH" and "a.yaml -> b.yaml -> a.yaml" in error.message
    assert error.location.file.endswith("b.yaml") and error.path == ("nodes", 0, "graph", "nodes", 0, "graph")


def test_a_subgraph_file_outside_the_tree_needs_trust(tmp_path):
    write(tmp_path / "elsewhere", {"research.yaml": CHILD})
    parent = PARENT.replace("parts/research.yaml", "../../elsewhere/research.yaml")
    path = write(tmp_path / "repo" / "topologies", {"review.yaml": parent})
    assert refused(load_graph, path).code == "E_PATH"
    assert load_graph(path, trusted=True).nodes[1].graph.name == "research"


def test_a_missing_subgraph_file_is_named_with_its_line(tmp_path):
    path = write(tmp_path / "t", {"review.yaml": PARENT})
    error = refused(load_graph, path)
    assert error.code == "E_UNKNOWN_REF" and "parts/research.yaml" in error.message
    assert error.location.line == 12


def test_a_problem_inside_a_subgraph_names_its_path_file_and_line(tmp_path):
    child = CHILD.replace("Summarise what you read about {topic}.", "Summarise {topik}.")
    path = write(tmp_path / "t", {"review.yaml": PARENT, "parts/research.yaml": child})
    error = refused(validate_file, path)
    assert error.code == "E_TEMPLATE" and error.path == ("nodes", 1, "graph", "nodes", 1, "prompt")
    assert error.location.file.endswith("research.yaml") and error.location.line == 13
    assert "in subgraph research:" in error.message


def test_a_path_in_a_spec_not_read_from_a_file_is_refused():
    spec = GraphSpec.model_validate({"name": "p", "inputs": {"q": "str"}, "nodes": [
        {"name": "s", "graph": "parts/research.yaml", "output": True}]})
    error = refused(Graph.from_spec(spec).validate)
    assert error.code == "E_SUBGRAPH" and "was never read" in error.message


# -- validation ------------------------------------------------------------------------------------


def child_graph(**changes) -> Graph:
    graph = Graph("research").input("topic").input("notes", "list[str]")
    graph.model("base").agent("reader", model="base", max_new_tokens=4).agent("writer", model="base", max_new_tokens=4)
    graph.node("reader", agent="reader", foreach="notes", item="note", generate=False, prompt="About {topic}: {note}")
    graph.node("summary", agent="writer", output=True, prompt="Summarise {topic}.")
    graph.edge("reader", "summary", Policy(ratio=2))
    return graph


def parent_graph(child: Graph | GraphSpec, *, policy=None, **options) -> Graph:
    graph = Graph("review").input("question").input("reports", "list[str]")
    graph.model("base").agent("a", model="base", max_new_tokens=4)
    text = policy is not None and policy.mode == "text"
    graph.node("intro", agent="a", generate=text, prompt="Question: {question}")  # (a text edge needs its text)
    options.setdefault("inputs", {"topic": "{question}", "notes": "{reports}"})
    graph.subgraph("research", child, **options)
    graph.node("final", agent="a", output=True, prompt="Answer: {question}")
    graph.edge("intro", "research", policy).edge("research", "final", policy)
    return graph


@pytest.mark.parametrize("field, value", [("prompt", "hi"), ("generate", False), ("interrupt", "before")])
def test_fields_a_subgraph_node_does_not_use_are_refused(field, value):
    error = refused(parent_graph, child_graph(), **{field: value})
    assert error.code == "E_SUBGRAPH" and field in error.message


def test_inputs_and_returns_without_graph_are_refused():
    with pytest.raises(GraphError, match="only subgraph nodes use"):
        Graph("g").model("base").agent("a", model="base").node("n", agent="a", prompt="x", returns="y")


def test_unknown_missing_and_mistyped_subgraph_inputs_are_each_named():
    unknown = refused(parent_graph(child_graph(), inputs={"topic": "{question}", "notes": "{reports}",
                                                          "topc": "x"}).validate)
    assert unknown.code == "E_SUBGRAPH" and unknown.path == ("nodes", 1, "inputs", "topc")
    assert "did you mean 'topic'" in unknown.fix
    missing = refused(parent_graph(child_graph(), inputs={"topic": "{question}"}).validate)
    assert missing.path == ("nodes", 1, "inputs", "notes") and "needs input 'notes'" in missing.message
    text_for_list = refused(parent_graph(child_graph(), inputs={"topic": "{question}", "notes": "{question}"}).validate)
    assert text_for_list.path == ("nodes", 1, "inputs", "notes") and "list[str]" in text_for_list.message


def test_inputs_pass_by_name_lists_of_templates_and_defaults():
    child = child_graph()
    graph = parent_graph(child, inputs={"notes": ["first: {question}", "second"]})
    graph._inputs.pop("question")
    graph.input("topic")  # passed by name
    graph._nodes[0] = graph._nodes[0].model_copy(update={"prompt": "Topic: {topic}"})
    graph._nodes[2] = graph._nodes[2].model_copy(update={"prompt": "Answer: {topic}"})
    with pytest.raises(GraphError, match="question"):  # {question} is no variable of the subgraph node any more
        graph.plan({"topic": "pools", "reports": ["x"]})
    graph = parent_graph(child, inputs={"notes": ["first: {question}", "second"], "topic": "{reports}"})
    plan = graph.plan({"question": "q", "reports": ["a", "b"]})
    assert plan.scopes["research"].inputs == {"topic": "a\nb", "notes": ("first: q", "second")}


def test_returns_must_name_one_output_node_without_copies():
    child = child_graph().node("extra", agent="writer", output=True, prompt="More about {topic}.")
    two = refused(parent_graph(child).validate)
    assert two.code == "E_SUBGRAPH" and "2 output nodes" in two.message and two.path == ("nodes", 1, "returns")
    assert parent_graph(child, returns="extra").plan({"question": "q", "reports": ["r"]}).scopes[
        "research"].returns == "research/extra"
    not_output = refused(parent_graph(child_graph(), returns="reader").validate)
    assert not_output.code == "E_SUBGRAPH" and "not an output node" in not_output.message


def test_state_edges_are_checked_against_the_nodes_they_really_meet():
    child = child_graph()
    child._agents = [agent.model_copy(update={"model": "other"}) for agent in child._agents]
    child.model("other", "./somewhere")
    error = refused(parent_graph(child).validate)
    assert error.codes() == ("E_CROSS_MODEL", "E_CROSS_MODEL")
    assert "into research/reader" in error.message and error.path == ("edges", 0, "policy")
    assert "from research/summary into final" in error.problems[1].message
    assert parent_graph(child, policy=TEXT).validate()  # text crosses models


def lookup(inputs, senders):
    return {"topic": inputs["topic"], "notes": inputs["notes"], "senders": sorted(senders)}


def facts_child() -> Graph:
    child = Graph("facts").input("topic").input("notes", "list[str]").model("base").agent("w", model="base")
    child.function("lookup", lookup)
    child.node("summary", agent="w", output=True, prompt="Summarise {topic}.")
    child.edge("lookup", "summary", TEXT)
    return child


def test_a_state_edge_into_a_subgraph_whose_entry_is_a_function_is_refused():
    error = refused(parent_graph(facts_child(), policy=Policy(mode="state", ratio=4)).validate)
    assert error.code == "E_FUNCTION" and "research/lookup" in error.message


def test_a_plain_edge_carries_text_into_a_subgraph_whose_entry_is_a_function_and_out_of_one_returning_one():
    """Issue 27: a plain edge meets what the subgraph node stands for: text into an entry
    function node, text out of a returned function node, state between agents."""
    def plain_parent(child: Graph) -> Graph:
        graph = parent_graph(child)
        graph._nodes[0] = graph._nodes[0].model_copy(update={"generate": True})  # its text crosses a text edge
        return graph

    into = plain_parent(facts_child()).plan({"question": "q", "reports": ["r"]})
    modes = {(edge.source, edge.target): edge.policy.mode for edge in into.edges}
    assert modes[("intro", "research/lookup")] == "text"
    assert modes[("research/summary", "final")] == "state"  # the returned node is an agent
    returning = Graph("facts").input("topic").input("notes", "list[str]").model("base").agent("w", model="base")
    returning.node("summary", agent="w", generate=True, prompt="Summarise {topic}.")
    returning.function("lookup", lookup, output=True)
    returning.edge("summary", "lookup", TEXT)
    out = plain_parent(returning).plan({"question": "q", "reports": ["r"]})
    modes = {(edge.source, edge.target): edge.policy.mode for edge in out.edges}
    assert modes[("research/lookup", "final")] == "text"
    assert modes[("intro", "research/summary")] == "state"


def test_one_model_name_means_one_model_across_subgraphs():
    child = child_graph()
    child._models[0] = ModelSpec(name="base", source="./another")
    error = refused(parent_graph(child).validate)
    assert error.code == "E_SUBGRAPH" and "model 'base' is declared twice" in error.message


def test_a_run_time_foreach_on_a_subgraph_node_is_refused():
    with pytest.raises(GraphError, match="run-time list") as caught:
        parent_graph(child_graph(), foreach={"node": "intro"})
    assert caught.value.code == "E_SUBGRAPH"


def test_subgraphs_nested_too_deep_are_refused():
    inner: Graph | GraphSpec = Graph("leaf").input("q").model("base").agent("a", model="base")
    inner.node("x", agent="a", prompt="{q}", output=True)
    for level in range(9):
        outer = Graph(f"level{level}").input("q").model("base")
        outer.subgraph("inner", inner, output=True)
        inner = outer
    error = refused(inner.validate)
    assert error.code == "E_SUBGRAPH" and "nested more than 8" in error.message


# -- planning --------------------------------------------------------------------------------------


def test_copies_of_a_subgraph_node_each_plan_their_own_instance():
    graph = Graph("many").input("questions", "list[str]").model("base").agent("a", model="base")
    child = Graph("one").input("topic").model("base").agent("a", model="base")
    child.node("answer", agent="a", output=True, prompt="Q: {topic}")
    graph.subgraph("ask", child, foreach="questions", item="question", inputs={"topic": "{index}. {question}"})
    graph.node("final", agent="a", output=True, prompt="Combine.")
    graph.edge("ask", "final", TEXT)
    plan = graph.plan({"questions": ["a?", "b?"]})
    assert plan.order == ("ask[0]/answer", "ask[1]/answer", "final")
    assert plan.node("ask[1]/answer").prompt == "Q: 1. b?" and plan.node("ask[1]/answer").scope == "ask[1]"
    assert plan.senders("final") == ("ask[0]/answer", "ask[1]/answer")


def test_a_subgraph_node_in_a_loop_plans_one_instance_per_round():
    child = Graph("draft").input("topic").model("base").agent("a", model="base")
    child.node("write", agent="a", output=True, prompt="Draft {topic}")
    graph = Graph("loop").input("topic").model("base").agent("a", model="base")
    graph.subgraph("drafting", child)
    graph.node("critic", agent="a", prompt="Critique")
    graph.node("final", agent="a", output=True, prompt="Final")
    graph.edge("drafting", "critic", TEXT).edge("critic", "drafting", TEXT, rounds=2).edge("critic", "final", TEXT)
    plan = graph.plan({"topic": "t"})
    assert plan.order == ("drafting@1/write", "critic@1", "drafting@2/write", "critic@2", "final")
    assert plan.senders("drafting@2/write") == ("critic@1",)


def test_nested_subgraphs_compose_their_names_scopes_and_outputs():
    leaf = Graph("leaf").input("topic").model("base").agent("a", model="base")
    leaf.node("x", agent="a", prompt="{topic}", output=True)
    middle = Graph("middle").input("topic").model("base")
    middle.subgraph("inner", leaf, output=True)
    top = Graph("top").input("topic").model("base")
    top.subgraph("outer", middle, output=True)
    plan = top.plan({"topic": "t"})
    node = plan.node("outer/inner/x")
    assert node.scope == "outer/inner" and node.declared == "outer/inner/x"
    assert node.spec_path == ("nodes", 0, "graph", "nodes", 0, "graph", "nodes", 0)
    assert plan.outputs == ("outer/inner/x",) and plan.output_key("outer/inner/x") == "outer"
    assert set(plan.scopes) == {"outer", "outer/inner"} and plan.scopes["outer/inner"].node == "outer/inner"


def test_the_builder_writes_subgraphs_inline_and_they_load_back_equal(tmp_path):
    graph = parent_graph(child_graph())
    path = tmp_path / "review.yaml"
    path.write_text(graph.to_yaml(), encoding="utf-8")
    assert load_graph(path) == graph.spec()
    assert "topic: str" in graph.to_yaml()  # the input shorthand inside the subgraph too


# -- running ---------------------------------------------------------------------------------------


def answers(reading: NodeReading) -> str:
    return f"{reading.node.name}: {reading.node.prompt}"


def test_a_run_answers_under_the_subgraph_node_and_records_its_instance(tmp_path):
    plan = parent_graph(child_graph(), output=True).plan(INPUTS)
    result, record, run_dir = run_recorded_sync(plan, tmp_path, executor=FakeExecutor(text=answers))
    assert result.status == "finished", result.error
    assert result.outputs["research"] == "research/summary: Summarise what broke?."
    assert record["outputs"]["research"] == result.outputs["research"]
    assert record["plan"]["output_keys"]["research/summary"] == "research"
    assert [node["scope"] for node in record["plan"]["nodes"]] == ["", "research", "research", "research", ""]
    assert (run_dir / "nodes" / "research..summary.json").is_file()
    # lineage crosses the boundary: final holds positions intro and the subgraph's nodes created
    origins = set(result.nodes["final"].lineage.summary()["by_node"])
    assert {"intro", "research/reader[0]", "research/reader[1]", "research/summary"} <= origins
    page = render_report(record)
    assert "<h2>Subgraphs</h2>" in page and "research/summary (returned)" in page
    assert 'data-scope="research"' in page  # the drawing frames the subgraph's nodes


def test_a_failure_inside_a_subgraph_names_its_path():
    plan = parent_graph(child_graph()).plan(INPUTS)
    result = run_plan_sync(plan, executor=FakeExecutor(fail={"research/summary"}))
    assert result.status == "failed" and result.failed_node == "research/summary"
    assert result.error.startswith("node 'research/summary': RuntimeError")


def topic_facts(inputs, senders):
    return {"topic": inputs["topic"], "notes": inputs["notes"], "from": sorted(senders)}


def test_a_function_inside_a_subgraph_reads_the_subgraph_inputs():
    child = Graph("facts").input("topic").input("notes", "list[str]").model("base").agent("w", model="base")
    child.function("lookup", topic_facts, output=True)
    plan = parent_graph(child, policy=TEXT, output=True).plan(INPUTS)
    result = run_plan_sync(plan, executor=FakeExecutor(text=answers))
    assert result.status == "finished", result.error
    assert json.loads(result.nodes["research/lookup"].text) == {
        "topic": "what broke?", "notes": INPUTS["reports"], "from": ["intro"]}


def test_a_node_inside_a_subgraph_waits_for_a_person_and_is_answered_by_its_path(tmp_path):
    child = child_graph()
    child._nodes[1] = child._nodes[1].model_copy(update={"interrupt": "after"})
    graph = parent_graph(child)
    result, record, run_dir = run_recorded_sync(graph.plan(INPUTS), tmp_path, executor=FakeExecutor(text=answers))
    assert result.status == "waiting" and result.waiting[0]["node"] == "research/summary"
    with pytest.raises(GraphError, match="not a node that takes an answer"):
        graph.plan(INPUTS, answers={"research/reader[0]": "no"})
    up_front = run_plan_sync(graph.plan(INPUTS, answers={"research/summary": "checked"}),
                             executor=FakeExecutor(text=answers))
    assert up_front.status == "finished" and "checked" in up_front.nodes["research/summary"].effective_text


def test_state_crosses_into_and_out_of_a_subgraph_on_a_real_model(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    plan = parent_graph(child_graph(), output=True).plan(INPUTS)
    result = run_plan_sync(plan, executor=LocalExecutor(pool))
    assert result.status == "finished", result.error
    entry = result.nodes["research/reader[0]"]
    assert entry.inherited_positions > 0 and entry.lineage.summary()["by_node"]["intro"] > 0
    final = result.nodes["final"].lineage.summary()["by_node"]
    assert final.get("research/summary", 0) > 0 and final.get("intro", 0) > 0
    assert [hop.source for hop in result.nodes["final"].hops] == ["research/summary"]


def split_order(inputs, senders):
    return [item.strip() for item in inputs["order"].split(",")]


def ask_about_mugs(inputs, senders):
    from rclc_graph import Interrupt

    if inputs["item"] == "mug" and "answer" not in inputs:
        raise Interrupt("Is the mug in stock?")
    return f"{inputs['item']}: {inputs.get('answer', 'in stock')}"


def joined(inputs, senders):
    return "; ".join(senders.values())


def test_a_waiting_node_inside_a_subgraph_resumes_with_its_answer_and_functions(tmp_path):
    stock = Graph("stock_check").input("order")
    stock.function("split", split_order)
    stock.function("check", ask_about_mugs, foreach={"node": "split", "max_items": 4})
    stock.function("summary", joined, output=True)
    stock.edge("check", "summary", TEXT)
    shop = Graph("shop").input("order").subgraph("stock", stock, output=True)
    result, record, run_dir = run_recorded_sync(shop.plan({"order": "kettle, mug"}), tmp_path)
    assert result.status == "waiting" and result.waiting[0]["node"] == "stock/check[1]"
    with pytest.raises(Exception, match="functions="):
        resume_run_sync(run_dir, answers={"stock/check[1]": "sold out"})
    resumed, record, _ = resume_run_sync(run_dir, answers={"stock/check[1]": "sold out"}, functions=shop.functions)
    assert resumed.status == "finished" and resumed.outputs == {"stock": "kettle: in stock; mug: sold out"}
    assert record["attempts"][-1]["ran"] == ["stock/check[1]", "stock/summary"]
    assert record["answers"] == {"stock/check[1]": "sold out"}


def test_a_loop_that_stops_on_a_subgraph_nodes_output():
    child = Graph("draft").input("topic").model("base").agent("a", model="base")
    child.node("write", agent="a", output=True, prompt="Draft {topic}")
    graph = Graph("loop").input("topic").model("base").agent("a", model="base")
    graph.subgraph("drafting", child)
    graph.node("critic", agent="a", prompt="Critique {topic}")
    graph.node("final", agent="a", output=True, prompt="Final")
    graph.edge("critic", "drafting", TEXT)
    graph.edge("drafting", "critic", TEXT, rounds=3, until={"contains": "drafting@2"})
    graph.edge("drafting", "final", TEXT)
    plan = graph.plan({"topic": "t"})
    stops = {edge.stop.check for edge in plan.edges if edge.stop is not None}
    assert stops == {"drafting@1/write", "drafting@2/write"}
    result = run_plan_sync(plan, executor=FakeExecutor(text=answers))
    assert result.status == "finished", result.error
    assert {"critic@3", "drafting@3/write"} <= set(result.skipped)  # it stopped on drafting@2's output
    assert [hop.source for hop in result.nodes["final"].hops] == ["drafting@2/write"]
