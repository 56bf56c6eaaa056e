"""Full edges and fan-ins against the receiver's context: refused at plan time when they can
never fit, never compressed silently at run time (run/capacity.py, transfer_options.py)."""

from __future__ import annotations

import pytest

from rclc_graph import Graph, ModelPool, Policy
from rclc_graph.errors import PlanError
from rclc_graph.run.preflight import check_context, prompt_tokens
from rclc_graph.run.scheduler import run_plan_sync
from rclc_graph.spec.models import ModelSpec

DOCUMENT = "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo."


@pytest.fixture
def pool(tiny):
    model, tokenizer = tiny
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    return pool


def _fan_in(senders: int, policy: Policy, *, context_limit: int | None) -> object:
    graph = Graph("fan").input("question").input("documents", "list[str]")
    graph.model("base")
    graph.agent("reader", model="base", max_new_tokens=4)
    graph.agent("answerer", model="base", max_new_tokens=4, context_limit=context_limit)
    graph.node("s", agent="reader", prompt="{item}", foreach="documents", generate=False)
    graph.node("final", agent="answerer", prompt="{question}", output=True)
    graph.edge("s", "final", policy)
    return graph.plan({"question": "Who owns Cedar?", "documents": [DOCUMENT + " " + DOCUMENT] * senders})


# issue 16 item 2: 10 senders into context_limit 300 reported "kept 26/57 (full)"
def test_a_full_fan_in_that_cannot_fit_is_refused_at_plan_time(pool):
    plan = _fan_in(10, Policy(mode="full"), context_limit=300)
    with pytest.raises(PlanError) as raised:
        check_context(plan, pool)
    problem = raised.value.problems[0]
    assert problem.code == "E_CONTEXT" and "full edge into 'final'" in problem.message
    assert "hands over the whole state or fails" in problem.message and problem.path == ("edges", 0, "policy", "mode")
    assert "mode: state" in problem.fix


# issue 16 item 2: at run time (no preflight) a full edge fails instead of being compressed
def test_a_full_edge_is_never_compressed_at_run_time(pool):
    result = run_plan_sync(_fan_in(10, Policy(mode="full"), context_limit=300), pool=pool)
    assert result.status == "failed"
    assert "full edge: the receiver has room for" in result.error and "'s[0]' -> 'final' (full)" in result.error
    assert not [hop for hop in result.hops if hop.mode == "full" and hop.kept_positions < hop.total_positions]
    # where it fits, everything is handed over
    fine = run_plan_sync(_fan_in(3, Policy(mode="full"), context_limit=None), pool=pool)
    assert fine.status == "finished", fine.error
    assert all(hop.kept_positions == hop.total_positions for hop in fine.hops)
    check_context(_fan_in(3, Policy(mode="full"), context_limit=None), pool)


# issue 16 item 9: a fan-in that cannot fit was found only after every sender had run
def test_a_fan_in_whose_groups_cannot_fit_together_is_refused_at_plan_time(pool):
    def graph(limit):
        g = Graph("two").input("question").input("document")
        g.model("base")
        g.agent("reader", model="base", max_new_tokens=4)
        g.agent("answerer", model="base", max_new_tokens=4, context_limit=limit)
        g.node("a", agent="reader", prompt="{document}", generate=False)
        g.node("b", agent="reader", prompt="{document} Also in Lima.", generate=False)
        g.node("final", agent="answerer", prompt="{question}", output=True)
        g.edge("a", "final", Policy(mode="full"))  # one transfer call
        g.edge("b", "final", Policy(ratio=2))  # another: each fits its own room, not both together
        return g.plan({"question": "Who owns Cedar?", "document": DOCUMENT})

    probe = graph(None)
    tokenizer = pool.profile(probe.node("a").model).tokenizer
    own = prompt_tokens(tokenizer, probe, "final")
    sender = prompt_tokens(tokenizer, probe, "a")
    limit = own + 4 + sender  # the full edge alone fills the receiver exactly
    plan = graph(limit)
    # before: the senders ran, then the receiver refused at generation
    late = run_plan_sync(plan, pool=pool)
    assert late.status == "failed" and "context space" in late.error and set(late.nodes) == {"a", "b"}
    with pytest.raises(PlanError) as raised:
        check_context(plan, pool)
    (problem,) = raised.value.problems
    assert problem.code == "E_CONTEXT" and f"node 'final' receives at least {sender + 1} positions" in problem.message
    assert problem.path == ("nodes", 2, "prompt")
    check_context(graph(limit + 1), pool)  # one more position: the floor of b's one sender fits


# issue 16 item 9: many state senders whose selector floors alone exceed the receiver's room
def test_state_senders_whose_floors_cannot_fit_are_refused(pool):
    probe = _fan_in(1, Policy(ratio=4), context_limit=None)
    tokenizer = pool.profile(probe.node("final").model).tokenizer
    own = prompt_tokens(tokenizer, probe, "final")
    plan = _fan_in(8, Policy(ratio=4), context_limit=own + 4 + 5)  # 8 senders, room for 5
    with pytest.raises(PlanError, match="receives at least 8 positions"):
        check_context(plan, pool)
    check_context(_fan_in(5, Policy(ratio=4), context_limit=own + 4 + 5), pool)
