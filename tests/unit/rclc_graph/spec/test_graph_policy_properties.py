"""Property tests over graph edge policies (issue 24): a tiny fan-in and chain topology on tiny
random models, with the edge policy's fields drawn together (mode, ratio or budget, selector,
span, exclude, allocation, reasoning, representation). Every combination either is refused
at planning with a located GraphError, or runs to the end with hop records that follow the
budget formula; a failure at run time must be a node failure that names the node, never a
traceback out of the scheduler. Examples are drawn from a fixed seed (`derandomize`)."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rclc.policy import BUILTIN_SELECTORS, EXCLUSION_REASONS, REASONING_CONTEXTS, SPAN_KINDS, BudgetPolicy
from rclc_graph import GraphError, Graph, LocalExecutor, ModelPool, run_plan_sync
from rclc_graph.spec.models import ModelSpec

DOCUMENTS = ["The Cedar project is owned by Alice. It launched in Oslo in May.",
             "Bob owns Birch.\nBirch started in Lima.\n\nCarol owns Pine, in Rome."]

policies = st.fixed_dictionaries({
    "mode": st.sampled_from(["state", "state", "state", "full", "text"]),
    "budget": st.one_of(st.none(), st.tuples(st.just("ratio"), st.integers(1, 6)),
                        st.tuples(st.just("budget"), st.integers(1, 48))),
    "selector": st.one_of(st.none(), st.sampled_from(BUILTIN_SELECTORS)),
    "span": st.one_of(st.none(), st.sampled_from(SPAN_KINDS)),
    "exclude": st.one_of(st.none(), st.sets(st.sampled_from(EXCLUSION_REASONS)).map(sorted)),
    "allocation": st.one_of(st.none(), st.sampled_from(["per_sender", "pooled"])),
    "reasoning": st.one_of(st.none(), st.tuples(st.sampled_from(REASONING_CONTEXTS), st.integers(1, 2))),
    "representation": st.one_of(st.none(), st.sampled_from(["embeddings", "token_ids+continuous"])),
    "misplaced": st.sampled_from([False] * 4 + [True]),  # keep options the mode does not take (refused)
})
MODE_OPTIONS = {"state": ("budget", "selector", "span", "exclude", "allocation", "reasoning", "representation"),
                "full": ("reasoning", "representation"), "text": ()}


def _policy(drawn) -> dict:
    policy = {"mode": drawn["mode"]}
    if not drawn["misplaced"]:
        drawn = {name: value if name in MODE_OPTIONS[drawn["mode"]] or name in ("mode", "misplaced") else None
                 for name, value in drawn.items()}
    if drawn["budget"] is not None:
        policy[drawn["budget"][0]] = drawn["budget"][1]
    for name in ("selector", "span", "exclude", "allocation", "representation"):
        if drawn[name] is not None:
            policy[name] = drawn[name]
    if drawn["reasoning"] is not None:
        context, steps = drawn["reasoning"]
        policy["reasoning"] = {"steps": steps, "context": context, "budget": steps}
    return policy


def _graph(policy: dict, shape: str) -> Graph:
    graph = Graph("policies").input("question").input("documents", "list[str]")
    graph.model("base").agent("reader", model="base", max_new_tokens=3).agent("answerer", model="base", max_new_tokens=3)
    graph.node("a", agent="reader", prompt="{question} {documents[0]}")
    graph.node("b", agent="reader", prompt="{documents[1]}")
    graph.node("final", agent="answerer", prompt="Answer: {question}", output=True)
    if shape == "chain":
        graph.edge("a", "b", policy).edge("b", "final", policy)
    else:
        graph.edge("a", "final", policy).edge("b", "final", policy)
    return graph


@pytest.fixture(scope="module")
def pool(tiny_qwen3):
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *tiny_qwen3)
    return pool


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=policies, shape=st.sampled_from(["fan_in", "chain"]))
def test_every_edge_policy_runs_by_the_formula_or_is_refused_where_it_is_written(pool, drawn, shape):  # issue 24 properties
    policy = _policy(drawn)
    try:
        plan = _graph(policy, shape).plan({"question": "Who owns Cedar?", "documents": DOCUMENTS})
    except GraphError as error:  # refused at planning: located, with a fix
        assert all(problem.fix and problem.path for problem in error.problems), error
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # token_ids+continuous is experimental
        result = run_plan_sync(plan, executor=LocalExecutor(pool))
    if result.status != "finished":  # a run-time refusal is a node's failure, named
        assert result.status == "failed" and result.failed_node in plan.order and result.error.startswith("node "), result
        return
    assert set(result.outputs) == {"final"}
    for hop in result.hops:
        if hop.mode == "text":
            assert hop.kept_positions == 0 and hop.payload_bytes > 0
        elif hop.mode == "full":
            assert hop.kept_positions == hop.total_positions + hop.added_latent_positions
        else:
            steps = policy["reasoning"]["steps"] if "reasoning" in policy else 0
            assert hop.kept_positions <= hop.total_positions + steps
            if "reasoning" not in policy and hop.allocation != "pooled":  # named, or the graph's default for a fan-in
                budget = {name: policy[name] for name in ("ratio", "budget") if name in policy}
                cap = BudgetPolicy.from_options(**budget).cap(hop.total_positions, hop.inherited_positions)
                assert hop.budget <= cap and hop.kept_positions == hop.budget, (hop, policy)
