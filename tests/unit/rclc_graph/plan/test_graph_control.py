"""Planning the fields that steer a run (plan/control.py, loops.py, compile.py, dag.py): loops
that may stop are left from every round, conditional edges are marked, `ready()` waits for
settled nodes and loop checks, answers enter the plan without changing its fingerprint, and
every mistake is refused with its code, field and fix. Pure: no model."""

from __future__ import annotations

import pytest

from rclc_graph import Graph, PlanError, Policy, load_graph_text
from rclc_graph import to_yaml as to_text

TEXT = Policy(mode="text")


def review_loop(rounds: int = 3) -> Graph:
    graph = Graph("review").input("brief")
    graph.model("base").agent("a", model="base")
    graph.node("writer", agent="a", prompt="{brief} round {round}")
    graph.node("critic", agent="a", prompt="Review:")
    graph.node("final", agent="a", prompt="Final:", output=True)
    graph.edge("writer", "critic")
    graph.edge("critic", "writer", rounds=rounds, until={"contains": "APPROVED"})
    graph.edge("writer", "final", TEXT)
    graph.edge("critic", "final", TEXT)
    return graph


def test_a_loop_that_may_stop_is_left_from_every_round():
    plan = review_loop().plan({"brief": "b"})
    into_final = [(edge.source, edge.stop and (edge.stop.check, edge.stop.round, edge.stop.exits))
                  for edge in plan.incoming("final")]
    assert into_final == [
        ("writer@1", ("critic@1", 1, True)), ("writer@2", ("critic@2", 2, True)), ("writer@3", None),
        ("critic@1", ("critic@1", 1, True)), ("critic@2", ("critic@2", 2, True)), ("critic@3", None),
    ]
    loop_edges = [(edge.source, edge.target, edge.stop.exits) for edge in plan.edges if edge.loop]
    assert loop_edges == [("critic@1", "writer@2", False), ("critic@2", "writer@3", False)]
    assert [edge.conditional for edge in plan.incoming("critic@2")] == [False]  # within a round


def test_a_loop_without_until_plans_as_before():
    graph = Graph("debate").input("q")
    graph.model("base").agent("a", model="base")
    graph.node("pro", agent="a", prompt="{q}").node("judge", agent="a", prompt="judge", output=True)
    graph.edge("pro", "pro", TEXT, rounds=3).edge("pro", "judge", TEXT)
    plan = graph.plan({"q": "x"})
    assert plan.senders("judge") == ("pro@3",) and not plan.conditional()


def test_ready_waits_for_settled_senders_and_the_loop_check():
    plan = review_loop().plan({"brief": "b"})
    assert plan.ready(set()) == ("writer@1",)
    assert plan.ready({"writer@1"}, {"writer@1"}) == ("critic@1",)
    assert plan.ready({"writer@1", "critic@1"}, {"writer@1", "critic@1"}) == ("writer@2",)
    # final waits for every round, finished or skipped
    settled = {"writer@1", "critic@1", "writer@2", "critic@2", "writer@3"}
    assert "final" not in plan.ready(settled, settled)
    assert plan.ready_after("critic@3", settled | {"critic@3"}, settled) == ("final",)


def test_an_exit_edge_waits_for_the_check_node_of_its_round():
    graph = Graph("two").input("q")
    graph.model("base").agent("a", model="base")
    graph.node("x", agent="a", prompt="{q}").node("c", agent="a", prompt="check")
    graph.node("out", agent="a", prompt="out", output=True)
    graph.edge("x", "c").edge("c", "x", rounds=2, until={"contains": "stop"})
    graph.edge("x", "out", TEXT).edge("c", "out", TEXT)
    plan = graph.plan({"q": "q"})
    edge = next(edge for edge in plan.incoming("out") if edge.source == "x@1")
    assert edge.waits_for == ("x@1", "c@1")


def test_answers_enter_the_plan_but_not_its_fingerprint():
    graph = Graph("ask").input("q")
    graph.model("base").agent("a", model="base")
    graph.node("ask", agent="a", prompt="{q} Notes: {answer}", interrupt="before", question="Notes for {q}?")
    graph.node("out", agent="a", prompt="out", output=True, interrupt="after")
    graph.edge("ask", "out", TEXT)
    unanswered = graph.plan({"q": "Cedar"})
    answered = graph.plan({"q": "Cedar"}, answers={"ask": "Be brief {not a field}", "out": "ok"})
    assert unanswered.node("ask").answer is None and unanswered.node("ask").prompt == "Cedar Notes: "
    assert unanswered.node("ask").question == "Notes for Cedar?"
    assert answered.node("ask").prompt == "Cedar Notes: Be brief {not a field}"  # answers are literal text
    assert answered.answers() == {"ask": "Be brief {not a field}", "out": "ok"}
    assert answered.fingerprint() == unanswered.fingerprint()
    assert unanswered.node("out").question.startswith("Node out finished")  # the default question


@pytest.mark.parametrize(
    "answers, words",
    [({"nobody": "x"}, "not a node that takes an answer"), ({"ask": 3}, "not text"), ("yes", "must be a mapping")],
)
def test_bad_answers_are_refused(answers, words):
    graph = Graph("ask").input("q")
    graph.model("base").agent("a", model="base")
    graph.node("ask", agent="a", prompt="{q} {answer}", interrupt="before", output=True)
    with pytest.raises(PlanError) as caught:
        graph.plan({"q": "x"}, answers=answers)
    assert caught.value.code == "E_INTERRUPT" and words in str(caught.value)
    assert caught.value.path[0] == "answers"


BASE = """\
version: 1
name: steer
inputs: {q: str}
models: [{name: base, source: embedded}, {name: other, source: embedded}]
agents: [{name: a, model: base}, {name: b, model: other}]
"""


def refused(body: str, *, trust_code: bool = False):
    spec = load_graph_text(BASE + body)
    with pytest.raises(PlanError) as caught:
        from rclc_graph import compile_plan

        compile_plan(spec, {"q": "x"}, trust_code=trust_code)
    return caught.value


@pytest.mark.parametrize(
    "body, code, path, fix",
    [
        ("""nodes:
  - {name: f, call: "json:dumps"}
  - {name: out, agent: a, prompt: "{q}", output: true}
edges: [{source: f, target: out, policy: {mode: state, ratio: 2}}]
""", "E_FUNCTION", ("edges", 0, "policy"), "mode: text"),
        ("""nodes:
  - {name: r, agent: a, prompt: "{q}", generate: false}
  - {name: out, agent: a, prompt: "{q}", output: true}
edges: [{source: r, target: out, when: {contains: x}}]
""", "E_GENERATE", ("edges", 0, "when"), "generate: true"),
        ("""nodes:
  - {name: x, agent: a, prompt: "{q}"}
  - {name: y, agent: a, prompt: "{q}", output: true}
edges:
  - {source: x, target: y, policy: {mode: text}}
  - {source: y, target: x, policy: {mode: text}, rounds: 2, until: {contains: ok}}
""", "E_LOOP", ("nodes", 1, "output"), "node after the loop"),
        ("""nodes:
  - {name: x, agent: a, prompt: "{q}"}
  - {name: y, agent: a, prompt: "{q}"}
  - {name: out, agent: a, prompt: "{q}", output: true}
edges:
  - {source: x, target: y, policy: {mode: text}, rounds: 2, until: {contains: a}}
  - {source: y, target: x, policy: {mode: text}, rounds: 2, until: {contains: b}}
  - {source: y, target: out, policy: {mode: text}}
""", "E_LOOP", ("edges", 1, "until"), "keep until on one loop edge"),
        ("""nodes:
  - {name: f, call: "json:dumps", output: true}
""", "E_TRUST_CODE", ("nodes", 0, "call"), "--trust-code"),
        ("""nodes:
  - {name: x, agent: a, prompt: "{q}"}
  - {name: out, agent: a, prompt: "{q}", output: true}
edges: [{source: x, target: out, when: {any: [{contains: a}, "mod.routes:pick"]}}]
""", "E_TRUST_CODE", ("edges", 0, "when"), "--trust-code"),
        ("""nodes:
  - {name: ask, agent: a, prompt: "{q}", interrupt: before, output: true}
""", "E_INTERRUPT", ("nodes", 0, "prompt"), "{answer}"),
        ("""nodes:
  - {name: ask, agent: a, prompt: "{q}", generate: false, interrupt: after}
  - {name: out, agent: a, prompt: "{q}", output: true}
edges: [{source: ask, target: out}]
""", "E_INTERRUPT", ("nodes", 0, "interrupt"), "generate: true"),
        ("""nodes:
  - {name: x, agent: a, prompt: "{q} {answer}", output: true}
""", "E_TEMPLATE", ("nodes", 0, "prompt"), "declare it under inputs"),
    ],
)
def test_steering_mistakes_are_refused_with_code_field_and_fix(body, code, path, fix):
    error = refused(body)
    problem = next(problem for problem in error.problems if problem.code == code)
    assert problem.path == path, problem
    assert fix in problem.fix, problem


@pytest.mark.parametrize(
    "node, path, words",
    [
        ({"name": "f", "call": "json:dumps", "prompt": "x"}, ("nodes", 0), "only agents use"),
        ({"name": "f", "call": "json:dumps", "agent": "a"}, ("nodes", 0, "agent"), "both agent"),
        ({"name": "f", "call": "not a ref"}, ("nodes", 0, "call"), "package.module:callable"),
        ({"name": "f", "agent": "a", "question": "why?"}, ("nodes", 0), "no interrupt"),
        ({"name": "f", "agent": "a", "interrupt": "during"}, ("nodes", 0, "interrupt"), "before"),
        ({"name": "f"}, ("nodes", 0, "agent"), "call: package.module:function"),
    ],
)
def test_node_field_mistakes_are_located(node, path, words):
    import yaml

    with pytest.raises(Exception) as caught:
        load_graph_text(BASE + yaml.safe_dump({"nodes": [node]}))
    error = caught.value
    assert error.path == path, error
    assert words in str(error)


def test_until_without_rounds_is_refused_at_the_edge():
    with pytest.raises(Exception) as caught:
        load_graph_text(BASE + """nodes:
  - {name: x, agent: a, prompt: "{q}"}
  - {name: out, agent: a, prompt: "{q}", output: true}
edges: [{source: x, target: out, until: {contains: a}}]
""")
    assert caught.value.code == "E_LOOP" and caught.value.path == ("edges", 0)


def test_an_interrupt_node_may_read_only_its_answer():
    spec = load_graph_text(BASE + """nodes:
  - {name: ask, agent: a, prompt: "Notes: {answer}", interrupt: before}
  - {name: out, agent: a, prompt: "{q}", output: true}
edges: [{source: ask, target: out, policy: {mode: text}}]
""")
    from rclc_graph import compile_plan

    plan = compile_plan(spec, {"q": "x"}, answers={"ask": "fine"})
    assert plan.node("ask").prompt == "Notes: fine"
    bare = load_graph_text(to_text(spec).replace("Notes: {answer}", "{answer}"))
    assert compile_plan(bare, {"q": "x"}).node("ask").answer is None  # unanswered: it waits, nothing refused
    with pytest.raises(PlanError) as caught:
        compile_plan(bare, {"q": "x"}, answers={"ask": "  "})
    assert caught.value.code == "E_INPUT"  # an answer that leaves the prompt blank


def test_an_input_named_answer_conflicts_only_with_interrupt_nodes():
    body = """nodes:
  - {name: ask, agent: a, prompt: "{answer}", interrupt: before, output: true}
"""
    spec = load_graph_text(BASE.replace("inputs: {q: str}", "inputs: {q: str, answer: str}") + body)
    from rclc_graph import validate

    with pytest.raises(PlanError) as caught:
        validate(spec)
    assert "E_INTERRUPT" in caught.value.codes()


def test_builder_functions_need_no_trust_code_but_references_do():
    graph = Graph("f").input("q")
    graph.function("f", _echo, output=True)
    plan = graph.plan({"q": "x"})
    assert plan.node("f").call == f"{__name__}:_echo" and plan.functions[plan.node("f").call] is _echo
    referenced = Graph("g").input("q").function("f", f"{__name__}:_echo", output=True)
    with pytest.raises(PlanError) as caught:
        referenced.plan({"q": "x"})
    assert caught.value.code == "E_TRUST_CODE"
    assert referenced.plan({"q": "x"}, trust_code=True).node("f").is_function


def test_the_builder_refuses_functions_records_could_not_name():
    from rclc_graph import SpecError

    graph = Graph("f").input("q")
    with pytest.raises(SpecError) as caught:
        graph.function("f", lambda inputs, senders: "x")
    assert caught.value.code == "E_FUNCTION" and caught.value.path == ("nodes", 0, "call")

    def nested(inputs, senders):
        return "x"

    with pytest.raises(SpecError):
        graph.function("f", nested)
    assert graph.spec().nodes == [] and graph.functions == {}  # refused calls leave the graph as it was


def _echo(inputs, senders):
    return inputs["q"]


def test_a_plain_edge_at_a_function_node_carries_text_and_between_agents_state():
    """Issue 27: an edge without policy: into or out of a function node is a text edge (a
    LangGraph user's plain edge passes the output along); between two agents it stays state."""
    from rclc_graph import compile_plan

    spec = load_graph_text(BASE + """nodes:
  - {name: reader, agent: a, prompt: "{q}"}
  - {name: f, call: "json:dumps"}
  - {name: writer, agent: a, prompt: "Write:"}
  - {name: out, agent: a, prompt: "Answer:", output: true}
edges:
  - {source: reader, target: f}
  - {source: f, target: writer}
  - {source: writer, target: out}
  - {source: reader, target: out, policy: {mode: full}}
""")
    plan = compile_plan(spec, {"q": "x"}, trust_code=True)
    modes = {(edge.source, edge.target): edge.policy.label for edge in plan.edges}
    assert modes == {("reader", "f"): "text", ("f", "writer"): "text", ("writer", "out"): "r4",
                     ("reader", "out"): "full"}
    assert spec.edges[0].policy is None  # the spec keeps what was written; planning resolves it
    assert plan.describe()["edges"][0]["policy"]["mode"] == "text"
