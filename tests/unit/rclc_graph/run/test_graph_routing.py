"""Conditional edges and loops that stop, at run time (run/routing.py, the scheduler): which
edges fire, which nodes are skipped and why, how skipping propagates, what events, results
and records say, and routers (trusted user code). Nodes run on `FakeExecutor`, whose texts
are chosen per node, so every decision is deterministic."""

from __future__ import annotations

import sys
import types

import anyio
import pytest

from rclc_graph import EventStream, Graph, Policy, run_plan, run_plan_sync, run_recorded, run_recorded_sync
from rclc_graph.testing import FakeExecutor
from tests.paths import ROOT

TEXT = Policy(mode="text")


def texts(table):
    """A FakeExecutor text function: the table's text for a node, else 'answer of NAME'."""
    return lambda reading: table.get(reading.node.name, f"answer of {reading.node.name}")


def triage() -> Graph:
    graph = Graph("triage").input("message")
    graph.model("base").agent("a", model="base")
    graph.node("triage", agent="a", prompt="{message}")
    graph.node("billing", agent="a", prompt="billing", output=True)
    graph.node("technical", agent="a", prompt="technical", output=True)
    graph.node("survey", agent="a", prompt="survey", output=True)
    graph.edge("triage", "billing", when={"contains": "billing"})
    graph.edge("triage", "technical", when={"not": {"contains": "billing"}})
    graph.edge("billing", "survey", TEXT)
    graph.edge("technical", "survey", TEXT)
    return graph


async def run_with_events(plan, executor):
    events = EventStream(max_events=100_000)
    result = await run_plan(plan, executor=executor, events=events)
    events.close()
    return result, [event async for event in events]


def test_one_branch_runs_the_other_is_skipped_and_a_join_runs_on_the_fired_edge():
    plan = triage().plan({"message": "I was charged twice"})
    executor = FakeExecutor(text=texts({"triage": "This is about billing."}))
    result, events = anyio.run(run_with_events, plan, executor)
    assert result.status == "finished", result.error
    assert result.skipped == {"technical": "no inbound edge fired (triage -> technical: condition not met)"}
    assert set(result.outputs) == {"billing", "survey"}  # a skipped output node is left out
    starts = {name: senders for kind, name, senders in executor.log if kind == "start"}
    assert starts["survey"] == ["billing"]  # only the fired edge is delivered
    assert [hop.source for hop in result.nodes["survey"].hops] == ["billing"]
    assert "technical" not in result.nodes["survey"].prompt_text
    node_events = [(e.payload["node"], e.payload["status"]) for e in events if e.kind == "node"]
    assert ("technical", "skipped") in node_events and ("technical", "started") not in node_events
    edges = [(e.payload["target"], e.payload["fired"]) for e in events if e.kind == "edge"]
    assert edges == [("billing", True), ("technical", False)]  # conditional edges, each decided once
    assert result.fired == {"triage->billing": True, "triage->technical": False}


def test_skipping_propagates_and_says_why():
    graph = triage()
    graph.node("followup", agent="a", prompt="follow up", output=True)
    graph.edge("technical", "followup", TEXT)
    plan = graph.plan({"message": "x"})
    result = run_plan_sync(plan, executor=FakeExecutor(text=texts({"triage": "billing"})))
    assert result.skipped["followup"] == "no inbound edge fired (technical skipped)"
    assert list(result.skipped) == ["technical", "followup"]


def test_no_route_at_all_skips_every_branch_and_the_run_still_finishes():
    graph = Graph("nowhere").input("m")
    graph.model("base").agent("a", model="base")
    graph.node("t", agent="a", prompt="{m}")
    graph.node("x", agent="a", prompt="x", output=True).node("y", agent="a", prompt="y", output=True)
    graph.edge("t", "x", when={"equals": "x"}).edge("t", "y", when={"equals": "y"})
    result = run_plan_sync(graph.plan({"m": "m"}), executor=FakeExecutor(text=texts({"t": "neither"})))
    assert result.status == "finished" and result.outputs == {} and set(result.skipped) == {"x", "y"}


def review(rounds=3) -> Graph:
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


@pytest.mark.parametrize("stop_at", [1, 2, 3, None])
def test_until_stops_the_loop_and_what_follows_reads_the_round_it_stopped_at(stop_at):
    approvals = {} if stop_at is None else {f"critic@{stop_at}": "APPROVED, ship it"}
    executor = FakeExecutor(text=texts(approvals))
    result = run_plan_sync(review().plan({"brief": "b"}), executor=executor)
    assert result.status == "finished", result.error
    last = 3 if stop_at is None else stop_at
    ran = [name for kind, name, _ in executor.log if kind == "start"]
    assert ran == [n for r in range(1, last + 1) for n in (f"writer@{r}", f"critic@{r}")] + ["final"]
    later = {f"{n}@{r}" for r in range(last + 1, 4) for n in ("writer", "critic")}
    assert set(result.skipped) == later
    assert all(reason == f"loop stopped after round {last} (until held)" for reason in result.skipped.values())
    final = result.nodes["final"]
    assert [hop.source for hop in final.hops] == [f"writer@{last}", f"critic@{last}"]
    assert result.outputs == {"final": "answer of final"}


def test_a_loop_stop_is_decided_before_the_next_round_starts():
    # b@2 reads only a@1, but the loop's verdict comes from c@1, which takes longer: b@2 waits for it
    graph = Graph("parallel").input("q")
    graph.model("base").agent("a", model="base")
    graph.node("a", agent="a", prompt="{q} {round}").node("b", agent="a", prompt="{q} b").node("c", agent="a", prompt="c")
    graph.node("out", agent="a", prompt="out", output=True)
    graph.edge("a", "c").edge("b", "a")
    graph.edge("c", "a", rounds=3, until={"contains": "stop"})
    graph.edge("a", "b", rounds=3)
    graph.edge("c", "out", TEXT)
    plan = graph.plan({"q": "q"})
    assert plan.senders("b@2") == ("a@1",)
    executor = FakeExecutor(text=texts({"c@1": "stop"}), delays={"c@1": 0.1})
    result = run_plan_sync(plan, executor=executor)
    assert result.status == "finished", result.error
    assert "b@2" not in result.nodes and result.skipped["b@2"] == "loop stopped after round 1 (until held)"
    assert [hop.source for hop in result.nodes["out"].hops] == ["c@1"]


def test_a_skipped_check_node_ends_the_loop():
    graph = Graph("gated").input("q")
    graph.model("base").agent("a", model="base")
    graph.node("w", agent="a", prompt="{q} {round}").node("c", agent="a", prompt="c")
    graph.node("out", agent="a", prompt="out", output=True)
    graph.edge("w", "c", when={"contains": "review me"})
    graph.edge("c", "w", rounds=3, until={"contains": "APPROVED"})
    graph.edge("w", "out", TEXT)
    graph.edge("c", "out", TEXT)
    executor = FakeExecutor(text=texts({"w@1": "review me", "w@2": "no review needed"}))
    result = run_plan_sync(graph.plan({"q": "q"}), executor=executor)
    assert result.status == "finished", result.error
    assert result.skipped["c@2"].startswith("no inbound edge fired (w@2 -> c@2: condition not met")
    assert result.skipped["w@3"] == "loop stopped after round 2 (c@2 was skipped)"
    assert [hop.source for hop in result.nodes["out"].hops] == ["w@2"]  # the round it ended at


def test_the_record_and_report_say_what_was_skipped(tmp_path):
    plan = triage().plan({"message": "x"})
    result, record, run_dir = run_recorded_sync(plan, tmp_path, executor=FakeExecutor(text=texts({"triage": "billing"})))
    assert record["status"] == "finished" and record["skipped"] == {"technical": result.skipped["technical"]}
    assert record["unfinished"] == [] and "technical" not in record["outputs"]
    assert record["node_status"] == {"triage": "finished", "billing": "finished", "technical": "skipped",
                                     "survey": "finished"}
    assert record["fired"] == {"triage->billing": True, "triage->technical": False}
    assert record["plan"]["edges"][0]["when"] == {"contains": "billing"}
    report = (run_dir / "report.html").read_text()
    assert "<h2>Skipped</h2>" in report and 'class="node skipped"' in report
    assert "technical (output)" in report


def test_a_router_decides_edges_once_per_sender_output(tmp_path, monkeypatch):
    calls = []

    def route(text):
        calls.append(text)
        return ["billing"] if "money" in text else "technical"

    module = types.ModuleType("routing_under_test")
    module.route = route
    monkeypatch.setitem(sys.modules, "routing_under_test", module)
    graph = Graph("routed").input("m")
    graph.model("base").agent("a", model="base")
    graph.node("t", agent="a", prompt="{m}")
    graph.node("billing", agent="a", prompt="b", output=True).node("technical", agent="a", prompt="t", output=True)
    graph.edge("t", "billing", when="routing_under_test:route").edge("t", "technical", when="routing_under_test:route")
    plan = graph.plan({"m": "m"}, trust_code=True)
    result = run_plan_sync(plan, executor=FakeExecutor(text=texts({"t": "money matters"})))
    assert result.status == "finished" and set(result.nodes) == {"t", "billing"}
    assert calls == ["money matters"]  # one call decided both edges
    with pytest.raises(Exception) as caught:
        graph.plan({"m": "m"})
    assert caught.value.code == "E_TRUST_CODE"


@pytest.mark.parametrize(
    "answer, message",
    [(7, "returned int 7"), (RuntimeError("router down"), "RuntimeError: router down")],
)
def test_a_failing_router_fails_the_receiving_node_and_names_the_edge(monkeypatch, answer, message):
    def route(text):
        if isinstance(answer, Exception):
            raise answer
        return answer

    module = types.ModuleType("bad_router")
    module.route = route
    monkeypatch.setitem(sys.modules, "bad_router", module)
    graph = Graph("routed").input("m")
    graph.model("base").agent("a", model="base")
    graph.node("t", agent="a", prompt="{m}").node("x", agent="a", prompt="x", output=True)
    graph.edge("t", "x", when="bad_router:route")
    result = run_plan_sync(graph.plan({"m": "m"}, trust_code=True), executor=FakeExecutor())
    assert result.status == "failed" and result.failed_node == "x"
    assert "edge 't' -> 'x'" in result.error and message in result.error


def test_an_until_router_must_answer_true_or_false(monkeypatch):
    module = types.ModuleType("until_router")
    module.stop = lambda text: "yes"
    monkeypatch.setitem(sys.modules, "until_router", module)
    graph = review()
    spec = graph.spec()
    edges = [edge.model_copy(update={"until": "until_router:stop"}) if edge.rounds else edge for edge in spec.edges]
    from rclc_graph import compile_plan

    plan = compile_plan(spec.model_copy(update={"edges": edges}), {"brief": "b"}, trust_code=True)
    result = run_plan_sync(plan, executor=FakeExecutor())
    assert result.status == "failed" and "an until router returns True (stop) or False (go on)" in result.error


def test_plans_without_conditions_decide_nothing():
    graph = Graph("plain").input("q")
    graph.model("base").agent("a", model="base")
    graph.node("a", agent="a", prompt="{q}").node("b", agent="a", prompt="b", output=True)
    graph.edge("a", "b")
    result, events = anyio.run(run_with_events, graph.plan({"q": "q"}), FakeExecutor())
    assert result.skipped == {} and result.fired == {}
    assert not [e for e in events if e.kind == "edge"]


def test_a_transfer_group_holds_only_fired_edges_and_lineage_only_fired_senders(tiny):
    """Two state senders share one policy (one budget fit); when one edge does not fire, the
    receiver gets exactly what it gets from a graph without that edge: same fit, same lineage."""
    from rclc_graph import ModelPool
    from rclc_graph.spec.models import ModelSpec

    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *tiny)

    def build(conditional: bool) -> Graph:
        graph = Graph("fan").input("q")
        graph.model("base").agent("a", model="base", max_new_tokens=3)
        graph.node("x", agent="a", prompt="{q} The Cedar project is owned by Alice.")
        graph.node("y", agent="a", prompt="{q} The Birch project is owned by Bob.", output=True)
        graph.node("out", agent="a", prompt="Who owns Cedar?", output=True)
        graph.policy("shared", Policy(budget=12))
        graph.edge("x", "out", "shared")
        if conditional:
            graph.edge("y", "out", "shared", when={"equals": "\u0000never"})
        return graph

    gated = run_plan_sync(build(True).plan({"q": "Note:"}), pool=pool)
    alone = run_plan_sync(build(False).plan({"q": "Note:"}), pool=pool)
    assert gated.status == alone.status == "finished", gated.error
    assert gated.fired == {"y->out": False} and gated.skipped == {}
    out, reference = gated.nodes["out"], alone.nodes["out"]
    assert [hop.source for hop in out.hops] == ["x"]
    assert out.lineage == reference.lineage and "y" not in out.lineage.counts_by_node()
    assert (out.text, out.positions, out.hops[0].budget) == (reference.text, reference.positions,
                                                            reference.hops[0].budget)


def test_the_terminal_shows_skips_live_and_in_the_record(tmp_path):
    import io

    from rich.console import Console

    from rclc_graph.views.terminal import ProgressView, render_record

    plan = triage().plan({"message": "x"})
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, force_terminal=False)
    view = ProgressView(plan, console)

    async def main():
        events = EventStream(max_events=10_000)
        async with anyio.create_task_group() as group:
            group.start_soon(view.consume, events)
            result, record, _ = await run_recorded(plan, tmp_path, executor=FakeExecutor(text=texts({"triage": "billing"})),
                                                   events=events)
            events.close()
        return record

    record = anyio.run(main)
    live = buffer.getvalue()
    assert "– technical  skipped: no inbound edge fired (triage -> technical: condition not met)" in live
    assert view.status["technical"] == "skipped"
    buffer.truncate(0)
    render_record(console, record, str(tmp_path))
    table = buffer.getvalue()
    assert "Skipped" in table and "technical (output: left out of Outputs)" in table


# issue 24 item 1: `when: {matches: '(.|..)*\x00'}` (also `(x|xx)*\x00`) passed the nested-repeat
# check and took exponential time on the event loop, so the whole server froze. RE2 matches in
# linear time; the check runs in a fresh interpreter so a regression fails by its timeout (the
# work takes milliseconds; the backtracking engine would not finish in a lifetime).
def test_patterns_that_froze_the_server_decide_a_long_text_at_once():
    import subprocess

    script = (
        "from rclc_graph.spec import predicates as p\n"
        "from pydantic import TypeAdapter\n"
        "condition = TypeAdapter(p.Condition)\n"
        "text = 'x' * 200_000 + '.' * 200_000\n"
        "for pattern in [r'(.|..)*\\x00', r'(x|xx)*\\x00', r'(\\w{1,10}){1,10}\\x00', r'(a|aa)+$']:\n"
        "    assert p.holds(condition.validate_python({'matches': pattern}), text) is False, pattern\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# issue 24 item 1: regular expressions and JSON conditions are decided in a worker thread, never on
# the event loop; substring tests stay on it (they cost nothing worth a thread)
def test_regex_and_json_conditions_are_decided_off_the_event_loop(monkeypatch):
    import threading

    from rclc_graph.spec import predicates

    threads = {}
    decide = predicates.holds

    def spy(condition, text, routed=None):
        threads[type(condition).__name__] = threading.current_thread() is threading.main_thread()
        return decide(condition, text, routed)

    monkeypatch.setattr(predicates, "holds", spy)
    graph = Graph("conditions").input("message")
    graph.model("base").agent("a", model="base")
    graph.node("t", agent="a", prompt="{message}")
    for name, when in [("r", {"matches": "bill"}), ("j", {"json": {"path": "x", "equals": 1}}),
                       ("c", {"contains": "bill"})]:
        graph.node(name, agent="a", prompt=name, output=True)
        graph.edge("t", name, when=when)
    result = run_plan_sync(graph.plan({"message": "m"}), executor=FakeExecutor(text=texts({"t": "a bill"})))
    assert result.status == "finished", result.error
    assert threads == {"Matches": False, "Json": False, "Contains": True}
