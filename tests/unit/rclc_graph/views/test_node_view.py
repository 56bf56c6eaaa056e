"""`rclc-graph inspect --node` shows what is specific to one node (views/node_view.py, issue 27):
a skipped node says why and which of its edges did not fire, a function node shows its
output without positions or lineage, a waiting node its question. Nodes run on FakeExecutor
and real functions, so every figure is deterministic."""

from __future__ import annotations

from rich.console import Console

from rclc_graph import Graph, Interrupt, run_recorded_sync
from rclc_graph.testing import FakeExecutor
from rclc_graph.views.node_view import render_node


def shown(record, name, run_dir=None) -> str:
    console = Console(record=True, width=200)
    render_node(console, record, name, run_dir)
    return console.export_text()


def route(inputs, senders):
    """A function node between agents."""
    return {"route": "billing", "seen": sorted(senders)}


def ask(inputs, senders):
    """Waits for a person."""
    if "answer" not in inputs:
        raise Interrupt("Send it?")
    return inputs["answer"]


def graph() -> Graph:
    graph = Graph("triage").input("message")
    graph.model("base").agent("a", model="base")
    graph.node("triage", agent="a", prompt="{message}")
    graph.function("router", route)
    graph.node("billing", agent="a", prompt="billing", output=True)
    graph.node("technical", agent="a", prompt="technical", output=True)
    graph.function("send", ask, output=True)
    graph.edge("triage", "router")
    graph.edge("router", "billing", when={"contains": "billing"})
    graph.edge("router", "technical", when={"not": {"contains": "billing"}})
    graph.edge("billing", "send")
    return graph


def test_each_node_shows_only_its_own_story(tmp_path):
    _, record, run_dir = run_recorded_sync(graph().plan({"message": "refund"}), tmp_path, executor=FakeExecutor())
    assert record["status"] == "waiting"

    router = shown(record, "router", str(run_dir))
    assert f"function {__name__}:route" in router and "reads from: triage; sends to: billing, technical" in router
    assert "router → billing: fired; router → technical: did not fire" in router
    assert '{"route":"billing","seen":["triage"]}' in router
    assert "a function node holds no model state" in router
    assert "Lineage" not in router and "Prompt" not in router and "inherited)" not in router

    technical = shown(record, "technical")
    assert "– skipped" in technical and "skipped: no inbound edge fired" in technical
    assert "Output" not in technical  # it never ran

    waiting = shown(record, "send")
    assert "waits for a person (raised): Send it?" in waiting and "--answer send=" in waiting

    billing = shown(record, "billing", str(run_dir))
    assert "agent a, model base" in billing and "Lineage" in billing and "Prompt" in billing
    assert "in: router → billing" in billing and "triage → router" not in billing  # not another node's hop
