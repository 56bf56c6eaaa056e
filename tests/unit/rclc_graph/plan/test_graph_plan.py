"""Validation and compilation: each error class, foreach, loops, order, fan-in, purity."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rclc_graph import Graph, GraphSpec, Policy, Reasoning, compile_plan, validate
from rclc_graph.errors import PlanError, SpecError
from rclc_graph.plan.policy import DEFAULT_RATIO
from tests.paths import ROOT



def base(*, inputs=(("question", "str"),)) -> Graph:
    graph = Graph("g")
    for name, kind in inputs:
        graph.input(name, kind)
    graph.model("base").model("other", "owner/other-model")
    graph.agent("a", model="base").agent("b", model="base").agent("x", model="other")
    return graph


def plan_error(graph: Graph | GraphSpec, inputs=None, *, trust_code=False) -> PlanError:
    spec = graph.spec() if isinstance(graph, Graph) else graph
    with pytest.raises(PlanError) as caught:
        if inputs is None:
            validate(spec, trust_code=trust_code)
        else:
            compile_plan(spec, inputs, trust_code=trust_code)
    return caught.value


def simple() -> Graph:
    graph = base()
    graph.node("reader", agent="a", prompt="{question}", generate=False)
    graph.node("final", agent="b", prompt="Answer {question}", output=True)
    graph.edge("reader", "final")
    return graph


def test_simple_plan():
    plan = simple().plan({"question": "Q"})
    assert plan.order == ("reader", "final") and plan.outputs == ("final",)
    edge = plan.edges[0]
    assert edge.policy.mode == "state" and edge.policy.ratio == DEFAULT_RATIO and edge.policy.selector == "cacheback"
    assert edge.policy.representation == "embeddings" and edge.request is None
    assert plan.node("final").prompt == "Answer Q" and plan.node("final").model.name == "base"
    assert plan.senders("final") == ("reader",) and plan.roots() == ("reader",)
    assert [model.name for model in plan.models()] == ["base"]


def test_a_policy_left_to_defaults_is_what_the_core_does_without_options():
    from rclc import policy as core

    edge = simple().plan({"question": "Q"}).edges[0]
    assert (edge.policy.ratio, edge.policy.selector, edge.policy.representation) == (
        core.DEFAULT_RATIO, core.DEFAULT_SELECTOR, core.DEFAULT_REPRESENTATION)
    assert edge.policy.label == core.BudgetPolicy.from_options().label == f"r{DEFAULT_RATIO}"


# -- one test per error class --------------------------------------------------------------------


def test_unknown_agent_model_node_policy_input():
    graph = Graph("g").input("question").model("base")
    graph.agent("a", model="bsae")
    graph.node("n", agent="aa", prompt="{question}", output=True, foreach="docs")
    graph.edge("n", "m", "fast")
    error = plan_error(graph)
    assert set(error.codes()) == {"E_UNKNOWN_REF"}
    paths = {problem.path for problem in error.problems}
    assert paths == {
        ("agents", 0, "model"),
        ("nodes", 0, "agent"),
        ("nodes", 0, "foreach"),
        ("edges", 0, "target"),
        ("edges", 0, "policy"),
    }
    assert "did you mean 'base'" in error.problems[0].fix


def test_duplicate_names_and_edges():
    spec = simple().spec()
    spec = spec.model_copy(update={"nodes": spec.nodes + [spec.nodes[0]], "edges": spec.edges + [spec.edges[0]]})
    error = plan_error(spec)
    assert error.codes() == ("E_DUPLICATE_NAME", "E_DUPLICATE_NAME")
    assert error.problems[0].path == ("nodes", 2, "name") and error.problems[1].path == ("edges", 1)


def test_builder_refuses_duplicates_at_once():
    with pytest.raises(SpecError) as caught:
        base().agent("a", model="base")
    assert caught.value.code == "E_DUPLICATE_NAME" and caught.value.path == ("agents", 3, "name")


def test_no_output_node():
    graph = base()
    graph.node("n", agent="a", prompt="{question}")
    error = plan_error(graph)
    assert error.code == "E_NO_OUTPUT"


def test_node_that_leads_nowhere():
    graph = simple()
    graph.node("stray", agent="a", prompt="{question}")
    graph.node("side", agent="a", prompt="{question}")
    graph.edge("stray", "side")
    error = plan_error(graph)
    assert error.codes() == ("E_UNREACHABLE", "E_UNREACHABLE")
    assert [problem.path for problem in error.problems] == [("nodes", 2), ("nodes", 3)]


def test_root_without_input_prompt():
    graph = base()
    graph.node("n", agent="a", prompt="Say hello", output=True)
    error = plan_error(graph)
    assert error.code == "E_NO_PROMPT" and error.path == ("nodes", 0, "prompt")


def test_ratio_and_budget_together_is_refused_by_the_builder():
    with pytest.raises(SpecError) as caught:
        Policy(ratio=4, budget=128)
    assert caught.value.code == "E_POLICY" and "keep one" in caught.value.fix


def test_ratio_and_budget_together_in_a_spec_dict():
    data = simple().spec().model_dump()
    data["edges"][0]["policy"] = {"ratio": 4, "budget": 8}
    with pytest.raises(Exception) as caught:
        GraphSpec.model_validate(data)
    assert "E_POLICY" in str(caught.value)


@pytest.mark.parametrize("mode", ["state", "full"])
def test_state_does_not_cross_models(mode):
    graph = base()
    graph.node("reader", agent="x", prompt="{question}")
    graph.node("final", agent="b", prompt="{question}", output=True)
    graph.edge("reader", "final", Policy(mode=mode))
    error = plan_error(graph)
    assert error.code == "E_CROSS_MODEL" and error.path == ("edges", 0) and "mode: text" in error.fix


def test_text_crosses_models():
    graph = base()
    graph.node("reader", agent="x", prompt="{question}")
    graph.node("final", agent="b", prompt="{question}", output=True)
    graph.edge("reader", "final", Policy(mode="text"))
    plan = graph.plan({"question": "q"})
    assert plan.edges[0].policy.label == "text" and plan.edges[0].policy.selector is None


def test_text_edge_needs_a_generating_sender_and_outputs_generate():
    graph = base()
    graph.node("reader", agent="a", prompt="{question}", generate=False)
    graph.node("final", agent="b", prompt="{question}", output=True, generate=False)
    graph.edge("reader", "final", Policy(mode="text"))
    error = plan_error(graph)
    assert error.codes() == ("E_GENERATE", "E_GENERATE")


def test_template_fields_must_be_inputs_or_variables():
    graph = base()
    graph.node("n", agent="a", prompt="{question} {colour} {round} {item}", output=True)
    graph.edge("n", "n", Policy(request="{question} {nope}"), rounds=2)
    error = plan_error(graph)
    assert set(error.codes()) == {"E_TEMPLATE"}
    messages = " ".join(problem.message for problem in error.problems)
    assert "{colour}" in messages and "{item}" in messages and "{nope}" in messages and "{round}" not in messages


def test_indexing_needs_a_list_input():
    graph = base()
    graph.node("n", agent="a", prompt="{question[0]}", output=True)
    assert plan_error(graph).code == "E_TEMPLATE"


def test_user_code_needs_trust_code():
    graph = simple()
    graph.policy("custom", Policy(selector="mypkg.select:pick", reasoning=Reasoning(method="mypkg.think:run")))
    graph.node("third", agent="a", prompt="{question}")
    graph.edge("third", "final", "custom")
    error = plan_error(graph)
    assert error.codes() == ("E_TRUST_CODE", "E_TRUST_CODE")
    assert {problem.path for problem in error.problems} == {
        ("policies", "custom", "selector"),
        ("policies", "custom", "reasoning", "method"),
    }
    plan = graph.plan({"question": "q"}, trust_code=True)
    assert plan.trust_code and plan.incoming("final")[1].policy.user_code() == (
        ("selector", "mypkg.select:pick"),
        ("reasoning.method", "mypkg.think:run"),
    )


def test_bad_selector_syntax_is_a_field_error():
    with pytest.raises(SpecError) as caught:
        Graph("g").edge("a", "b", {"selector": "os.system('x')"})
    assert caught.value.code == "E_FIELD" and caught.value.path == ("edges", 0, "policy", "selector")


def test_undeclared_cycle():
    graph = simple()
    graph.edge("final", "reader")
    error = plan_error(graph)
    assert error.code == "E_CYCLE" and "reader -> final -> reader" in error.message
    assert error.path == ("edges", 1)


def test_rounds_on_an_edge_that_closes_no_loop():
    graph = base()
    graph.node("a", agent="a", prompt="{question}")
    graph.node("b", agent="b", prompt="{question}", output=True)
    graph.edge("a", "b", rounds=3)
    error = plan_error(graph)
    assert error.code == "E_LOOP" and error.path == ("edges", 0, "rounds")


def test_loop_edges_must_agree_and_respect_the_limit():
    graph = base()
    graph.node("a", agent="a", prompt="{question}")
    graph.node("b", agent="b", prompt="{question}", output=True)
    graph.edge("a", "b").edge("b", "a", rounds=3).edge("a", "a", rounds=2)
    assert plan_error(graph).code == "E_LOOP"
    graph = base().limits(rounds=4)
    graph.node("a", agent="a", prompt="{question}", output=True)
    graph.edge("a", "a", rounds=5)
    error = plan_error(graph)
    assert error.code == "E_LOOP" and "limit" in error.message


def test_foreach_errors():
    graph = base(inputs=(("question", "str"), ("docs", "list[str]"), ("pages", "list[str]")))
    graph.node("w", agent="a", prompt="{item}", foreach="question")
    graph.node("v", agent="a", prompt="{question}", foreach="docs", item="question")
    graph.node("final", agent="b", prompt="{question}", output=True)
    graph.edge("w", "final").edge("v", "final")
    assert plan_error(graph).codes() == ("E_FOREACH", "E_FOREACH")
    graph = base(inputs=(("question", "str"), ("docs", "list[str]"), ("pages", "list[str]")))
    graph.node("w", agent="a", prompt="{item}", foreach="docs")
    graph.node("v", agent="a", prompt="{item}", foreach="pages", output=True)
    graph.edge("w", "v")
    assert plan_error(graph).code == "E_FOREACH"


def test_input_errors():
    graph = base(inputs=(("question", "str"), ("docs", "list[str]")))
    graph.node("w", agent="a", prompt="{item} {docs[2]}", foreach="docs", output=True)
    assert {p.message.split(" ")[1] for p in plan_error(graph, {}).problems} >= {"'question'", "'docs'"}
    assert plan_error(graph, {"question": "q", "docs": "a", "extra": 1}).codes() == ("E_INPUT", "E_INPUT")
    assert plan_error(graph, {"question": 3, "docs": ["a", "b", "c"]}).code == "E_INPUT"
    error = plan_error(graph, {"question": "q", "docs": ["a", "b"]})
    assert error.code == "E_INPUT" and "docs[2]" in error.message and error.path == ("nodes", 0, "prompt")
    error = plan_error(graph.limits(max_nodes=2), {"question": "q", "docs": ["a", "b", "c"]})
    assert error.code == "E_TOO_LARGE"


def test_empty_foreach_list():
    graph = base(inputs=(("question", "str"), ("docs", "list[str]")))
    graph.node("w", agent="a", prompt="{item}", foreach="docs", output=True)
    error = plan_error(graph, {"question": "q", "docs": []})
    assert error.code == "E_INPUT" and error.path == ("nodes", 0, "foreach")


def test_defaults_fill_inputs():
    graph = Graph("g").input("question", default="why?").input("docs", "list[str]", default=["a"]).model("base")
    graph.agent("a", model="base").node("n", agent="a", prompt="{question} {docs}", output=True)
    plan = graph.plan({})
    assert plan.inputs == {"question": "why?", "docs": ("a",)} and plan.node("n").prompt == "why? a"


# -- foreach, loops, order -------------------------------------------------------------------------


def fan_in() -> Graph:
    graph = base(inputs=(("question", "str"), ("docs", "list[str]")))
    graph.node("early", agent="a", prompt="{question}", generate=False)
    graph.node("w", agent="a", prompt="#{index}: {doc} ({question})", foreach="docs", item="doc", generate=False)
    graph.node("check", agent="a", prompt="check {doc}", foreach="docs", item="doc")
    graph.node("final", agent="b", prompt="{question}", output=True)
    graph.edge("w", "check", Policy(budget=16, request="{question} / {doc}"))
    graph.edge("early", "final", Policy(mode="full"))
    graph.edge("check", "final", Policy(mode="text"))
    graph.edge("w", "final", Policy(ratio=8, request="{question}"))
    return graph


def test_foreach_expansion_and_fan_in_order():
    plan = fan_in().plan({"question": "Q", "docs": ["d0", "d1", "d2"]})
    assert plan.order == ("early", "w[0]", "w[1]", "w[2]", "check[0]", "check[1]", "check[2]", "final")
    assert plan.node("w[1]").prompt == "#1: d1 (Q)" and plan.node("w[1]").item == "d1"
    assert [(e.source, e.target) for e in plan.incoming("check[2]")] == [("w[2]", "check[2]")]
    assert plan.incoming("check[2]")[0].request == "Q / d2"
    senders = plan.senders("final")  # edge declaration order, then foreach index
    assert senders == ("early", "check[0]", "check[1]", "check[2]", "w[0]", "w[1]", "w[2]")
    assert [edge.policy.label for edge in plan.incoming("final")] == ["full"] + ["text"] * 3 + ["r8"] * 3
    assert [edge.id for edge in plan.edges] == list(range(len(plan.edges)))
    assert plan.levels() == (("early", "w[0]", "w[1]", "w[2]"), ("check[0]", "check[1]", "check[2]"), ("final",))


def test_plan_is_deterministic_and_ready_follows_senders():
    inputs = {"question": "Q", "docs": ["d0", "d1"]}
    first, second = fan_in().plan(inputs), fan_in().plan(inputs)
    assert first == second and first.describe() == second.describe()
    assert first.ready(()) == ("early", "w[0]", "w[1]")
    assert first.ready({"w[0]"}, started={"early"}) == ("w[1]", "check[0]")
    done: set[str] = set()
    while len(done) < len(first.nodes):
        batch = first.ready(done)
        assert batch, "a plan must always make progress"
        done |= set(batch)
    assert first.ready(done) == ()


def test_sequential_debate_unrolls():
    graph = base()
    graph.node("pro", agent="a", prompt="r{round} {question}")
    graph.node("con", agent="b", prompt="r{round} {question}")
    graph.node("judge", agent="a", prompt="{question}", output=True)
    graph.edge("pro", "con", Policy(mode="text"))
    graph.edge("con", "pro", Policy(mode="text"), rounds=3)
    graph.edge("pro", "judge", Policy(mode="text")).edge("con", "judge", Policy(mode="text"))
    plan = graph.plan({"question": "q"})
    assert plan.order == ("pro@1", "con@1", "pro@2", "con@2", "pro@3", "con@3", "judge")
    assert [(e.source, e.target, e.loop) for e in plan.edges] == [
        ("pro@1", "con@1", False),
        ("pro@2", "con@2", False),
        ("pro@3", "con@3", False),
        ("con@1", "pro@2", True),
        ("con@2", "pro@3", True),
        ("pro@3", "judge", False),
        ("con@3", "judge", False),
    ]
    assert plan.node("con@2").prompt == "r2 q" and plan.node("pro@3").round == 3
    assert all(len(level) == 1 for level in plan.levels())


def test_simultaneous_debate_overlaps_and_leaves_from_the_last_round():
    graph = base()
    graph.node("entry", agent="a", prompt="{question}")
    graph.node("a", agent="a", prompt="r{round}")
    graph.node("b", agent="b", prompt="r{round}")
    graph.node("judge", agent="a", prompt="{question}", output=True)
    graph.edge("entry", "a").edge("entry", "b")
    graph.edge("a", "b", rounds=2).edge("b", "a", rounds=2).edge("a", "a", rounds=2).edge("b", "b", rounds=2)
    graph.edge("a", "judge").edge("b", "judge")
    plan = graph.plan({"question": "q"})
    assert plan.levels() == (("entry",), ("a@1", "b@1"), ("a@2", "b@2"), ("judge",))
    assert plan.senders("a@1") == ("entry",) and plan.senders("a@2") == ("b@1", "a@1")  # declaration order
    assert plan.senders("judge") == ("a@2", "b@2")


def test_dead_last_round_is_reported():
    graph = base()
    graph.node("a", agent="a", prompt="{question}")
    graph.node("b", agent="b", prompt="{question}")
    graph.node("judge", agent="a", prompt="{question}", output=True)
    graph.edge("a", "b", rounds=2).edge("b", "a", rounds=2).edge("b", "judge")
    error = plan_error(graph)  # a@1 -> b@2 -> judge lives; b@1 -> a@2 goes nowhere
    assert error.codes() == ("E_UNREACHABLE", "E_UNREACHABLE")
    assert [problem.message.split(" does")[0] for problem in error.problems] == ["node b (round 1 of 2)", "node a (round 2 of 2)"]
    assert [problem.path for problem in error.problems] == [("nodes", 1), ("nodes", 0)]


def test_output_inside_a_loop_is_its_last_round():
    graph = base()
    graph.node("a", agent="a", prompt="{question} {round}", output=True)
    graph.edge("a", "a", Policy(mode="full"), rounds=3)
    plan = graph.plan({"question": "q"})
    assert plan.outputs == ("a@3",) and plan.order == ("a@1", "a@2", "a@3")


def test_foreach_inside_a_loop_pairs_copies():
    graph = base(inputs=(("question", "str"), ("docs", "list[str]")))
    graph.node("w", agent="a", prompt="{item} {round}", foreach="docs")
    graph.node("final", agent="b", prompt="{question}", output=True)
    graph.edge("w", "w", rounds=2).edge("w", "final")
    plan = graph.plan({"question": "q", "docs": ["x", "y"]})
    assert plan.order == ("w[0]@1", "w[1]@1", "w[0]@2", "w[1]@2", "final")
    assert plan.senders("w[1]@2") == ("w[1]@1",) and plan.senders("final") == ("w[0]@2", "w[1]@2")


def test_reasoning_and_options_resolve():
    graph = simple()
    graph.node("extra", agent="a", prompt="{question}")
    policy = Policy(budget=64, selector="qsnap", selector_options={"span_size": 4},
                    reasoning=Reasoning(steps=8, context="selected_with_request", budget=8),
                    representation="token_ids+continuous")
    graph.edge("extra", "final", policy)
    edge = graph.plan({"question": "q"}).incoming("final")[1]
    assert edge.policy.label == "b64" and edge.policy.options == {"span": "fixed", "span_size": 4, "bridge": 1}
    assert edge.policy.reasoning.after_selection and edge.policy.reasoning.budget == 8
    with pytest.raises(SpecError) as caught:
        Reasoning(context="selected")
    assert caught.value.code == "E_POLICY" and "budget" in caught.value.fix


@pytest.mark.parametrize("field,value", [("selector", "qsnap"), ("ratio", 2), ("reasoning", {"steps": 2})])
def test_options_a_mode_does_not_use(field, value):
    with pytest.raises(SpecError) as caught:
        Graph("g").edge("a", "b", {"mode": "text", field: value})
    assert caught.value.code == "E_POLICY"


@pytest.mark.parametrize("modules", [
    "rclc_graph.plan.compile, rclc_graph.spec.load, rclc_graph.results.events, rclc_graph.results.lineage",
    "rclc_graph.spec, rclc_graph.plan, rclc_graph.results, rclc_graph.render",
    "rclc_graph",  # the whole public API: executors and runs import torch only when they run a model
])
def test_planning_imports_no_torch(modules):
    code = f"import sys, {modules}; print('torch' in sys.modules, 'transformers' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                            env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert result.stdout.strip() == "False False"


def test_template_syntax():
    from rclc_graph.spec import templates

    assert [str(field) for field in templates.fields("{a} {{literal}} {b[2]}")] == ["a", "b[2]"]
    for bad in ("{a.b}", "{0}", "{}", "{a!r}", "{a:>3}", "{a[x]}", "{a"):
        with pytest.raises(ValueError):
            templates.fields(bad)
    assert templates.render("{docs}|{docs[1]}|{{x}}", {"docs": ("p", "q")}) == "p\nq|q|{x}"


def test_fingerprint_follows_spec_and_inputs():
    inputs = {"question": "Q", "docs": ["d0", "d1"]}
    first = fan_in().plan(inputs)
    assert first.fingerprint() == fan_in().plan(dict(inputs)).fingerprint()
    assert first.fingerprint() != fan_in().plan({**inputs, "question": "other"}).fingerprint()
    changed = fan_in().agent("c", model="base", max_new_tokens=7)
    assert first.fingerprint() != changed.plan(inputs).fingerprint()
