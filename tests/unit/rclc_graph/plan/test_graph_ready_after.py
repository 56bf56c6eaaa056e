"""Plan.ready_after (incremental readiness) starts exactly the nodes ready() would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rclc_graph import Graph, Policy


def random_plan(edges: list[tuple[int, int]], nodes: int, list_items: int):
    graph = Graph("g")
    graph.input("q").input("items", "list[str]")
    graph.model("base", "embedded")
    graph.agent("a", model="base")
    for index in range(nodes):
        foreach = {"foreach": "items"} if index % 3 == 1 else {}
        graph.node(f"n{index}", agent="a", prompt="{q}", output=index == nodes - 1, **foreach)
    for index in range(nodes - 1):  # a spine, so every node reaches the output
        graph.edge(f"n{index}", f"n{index + 1}", Policy(mode="text"))
    for source, target in edges:
        if source < target and target != source + 1:
            graph.edge(f"n{source}", f"n{target}", Policy(mode="text"))
    return graph.plan({"q": "question", "items": [f"item {i}" for i in range(list_items)]})


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(2, 8),
    edges=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=12, unique=True),
    list_items=st.integers(1, 3),
    data=st.data(),
)
def test_incremental_readiness_matches_ready(nodes, edges, list_items, data):
    plan = random_plan([(s, t) for s, t in edges if s < nodes and t < nodes], nodes, list_items)
    finished: set[str] = set()
    started: set[str] = set(plan.ready(finished, started=()))
    running = sorted(started)
    while running:
        name = data.draw(st.sampled_from(running))  # any running node may finish next
        running.remove(name)
        finished.add(name)
        incremental = plan.ready_after(name, finished, started)
        assert incremental == plan.ready(finished, started)  # same nodes, same (plan) order
        started.update(incremental)
        running.extend(incremental)
    assert finished == set(plan.order)


def test_ready_after_checks_the_name_and_skips_started_nodes():
    plan = random_plan([(0, 2)], 3, 1)
    assert plan.ready_after("n0", {"n0"}) == ("n1[0]",)
    assert plan.ready_after("n0", {"n0"}, started={"n1[0]"}) == ()
    assert plan.ready_after("n1[0]", {"n0", "n1[0]"}) == ("n2",)
    assert plan.ready_after("n1[0]", {"n1[0]"}) == ()  # n2 also waits for n0
    with pytest.raises(KeyError, match="not in plan"):
        plan.ready_after("nobody", set())
