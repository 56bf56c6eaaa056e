"""Human in the loop (run/interrupts.py, the scheduler, resume, the CLI): a node stops the run
before it runs, after it ran, or by raising Interrupt; the run is recorded as "waiting" with
the question; a resume with the answer continues without recomputing anything finished, and
equals a run given that answer up front (every output, hop, lineage and snapshot). Agents run
on a tiny random model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rclc_graph import (
    EventStream,
    Graph,
    Interrupt,
    ModelPool,
    Policy,
    ResumeError,
    read_resume_point,
    resume_run_sync,
    run_recorded,
    run_recorded_sync,
    to_yaml,
)
from rclc_graph.spec.models import ModelSpec
from rclc_graph.views.cli import app

from tests.helpers.reliability import assert_same_runs

TEXT = Policy(mode="text")
CALLS: list[dict] = []


def approve(inputs, senders):
    """A gate: asks a person unless it has their answer."""
    CALLS.append(dict(inputs))
    if "answer" not in inputs:
        raise Interrupt(f"Publish this? {senders['draft'][:20]}")
    return {"published": inputs["answer"].strip().lower() == "yes", "draft": senders["draft"]}


def graph() -> Graph:
    graph = Graph("hitl").input("brief")
    graph.model("base").agent("a", model="base", max_new_tokens=5)
    graph.node("notes", agent="a", prompt="Brief: {brief}. Editor's notes: {answer}", interrupt="before",
               question="Any notes for the writer about {brief}?")
    graph.node("draft", agent="a", prompt="Draft:", interrupt="after")
    graph.function("gate", approve, output=True)
    graph.node("final", agent="a", prompt="Final:", output=True)
    graph.edge("notes", "draft", Policy(ratio=2))
    graph.edge("draft", "gate", TEXT)
    graph.edge("draft", "final", Policy(ratio=2))
    graph.edge("gate", "final", TEXT)
    return graph


ANSWERS = {"notes": "keep it short", "draft": "Looks fine.", "gate": "yes"}
FUNCTIONS = graph().functions  # what a resume needs to find the gate again
INPUTS = {"brief": "Cedar works offline"}


@pytest.fixture
def pool(tiny_qwen3):
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *tiny_qwen3)
    return pool


@pytest.fixture
def reference(pool, tmp_path):
    """The run given every answer up front."""
    result, record, run_dir = run_recorded_sync(graph().plan(INPUTS, answers=ANSWERS), tmp_path / "upfront", pool=pool)
    assert result.status == "finished", result.error
    return result, record, run_dir


def test_interrupt_before_waits_without_running_the_node(pool, tmp_path):
    result, record, run_dir = run_recorded_sync(graph().plan(INPUTS), tmp_path, pool=pool)
    assert result.status == record["status"] == "waiting"
    assert record["waiting"] == [{"node": "notes", "question": "Any notes for the writer about Cedar works offline?",
                                  "interrupt": "before", "shown": {}}]
    assert record["nodes"] == {} and record["outputs"] == {}
    assert record["unfinished"] == ["notes", "draft", "gate", "final"]
    assert record["node_status"] == {"notes": "waiting", "draft": "not run", "gate": "not run", "final": "not run"}
    assert "Waiting for a person" in (run_dir / "report.html").read_text()


def test_each_answer_continues_the_run_and_the_end_equals_answering_up_front(pool, tmp_path, reference):
    _, _, upfront = reference
    CALLS.clear()
    _, record, run_dir = run_recorded_sync(graph().plan(INPUTS), tmp_path / "asked", pool=pool)
    asked = []
    for name in ("notes", "draft", "gate"):
        assert record["status"] == "waiting" and record["waiting"][0]["node"] == name
        asked.append(record["waiting"][0])
        _, record, _ = resume_run_sync(run_dir, pool=pool, answers={name: ANSWERS[name]}, functions=FUNCTIONS)
    assert record["status"] == "finished", record["error"]
    assert [item["interrupt"] for item in asked] == ["before", "after", "raised"]
    assert asked[1]["shown"] == {"draft": record["nodes"]["draft"]["text"]}  # the output, for review
    assert asked[2]["question"].startswith("Publish this?")
    # nothing finished ran twice: notes and draft once each; the gate asked (it did not finish), then ran
    assert [attempt["ran"] for attempt in record["attempts"]] == [[], ["notes", "draft"], [], ["gate", "final"]]
    assert [("answer" in call) for call in CALLS] == [False, True]
    assert record["answers"] == ANSWERS
    assert_same_runs(upfront, run_dir)
    final_prompt = record["nodes"]["final"]["prompt_text"]
    assert '"published":true' in final_prompt
    draft_text = record["nodes"]["draft"]["text"]
    assert record["nodes"]["draft"]["answer"] == "Looks fine."
    assert CALLS[-1]["answer"] == "yes"
    assert f"{draft_text}\n\nLooks fine." in json.loads(record["nodes"]["gate"]["text"])["draft"]


def test_resuming_a_waiting_run_without_an_answer_is_refused_and_names_the_node(pool, tmp_path):
    _, _, run_dir = run_recorded_sync(graph().plan(INPUTS), tmp_path, pool=pool)
    before = (run_dir / "record.json").read_text()
    with pytest.raises(ResumeError, match=r"waits for an answer \(notes: Any notes .*--answer notes=TEXT"):
        read_resume_point(run_dir, functions=FUNCTIONS)
    with pytest.raises(ResumeError, match="not a node that takes an answer"):
        read_resume_point(run_dir, answers={"final": "x"}, functions=FUNCTIONS)
    assert (run_dir / "record.json").read_text() == before


def test_a_finished_node_keeps_its_answer(pool, tmp_path):
    _, _, run_dir = run_recorded_sync(graph().plan(INPUTS, answers={"notes": "short"}), tmp_path, pool=pool)
    with pytest.raises(ResumeError, match="already ran with the answer 'short'"):
        read_resume_point(run_dir, answers={"notes": "long", "draft": "ok"}, functions=FUNCTIONS)
    point = read_resume_point(run_dir, answers={"notes": "short", "draft": "ok"}, functions=FUNCTIONS)
    assert point.plan.answers() == {"notes": "short", "draft": "ok"}


def test_waiting_events_follow_the_contract(pool, tmp_path):
    import anyio

    async def main():
        events = EventStream(max_events=10_000)
        result, _, _ = await run_recorded(graph().plan(INPUTS, answers={"notes": "n"}), tmp_path, pool=pool,
                                          events=events)
        events.close()
        return result, [event async for event in events]

    result, events = anyio.run(main)
    waiting = [dict(e.payload) for e in events if e.kind == "node" and e.payload["status"] == "waiting"]
    assert waiting == [{"node": "draft", "status": "waiting", "question": result.waiting[0]["question"]}]
    runs = [dict(e.payload) for e in events if e.kind == "run"]
    assert runs[-1] == {"status": "waiting", "node": "draft", "question": result.waiting[0]["question"]}



@pytest.mark.parametrize("answer, hands_on", [("approved", True), ("not yet", False)])
def test_an_approval_gates_a_state_edge_that_carries_the_generated_state_only(pool, tmp_path, answer, hands_on):
    gated = Graph("gate").input("brief")
    gated.model("base").agent("a", model="base", max_new_tokens=5)
    gated.node("draft", agent="a", prompt="Brief: {brief}. Draft:", interrupt="after")
    gated.node("publish", agent="a", prompt="Publish:", output=True)
    gated.edge("draft", "publish", Policy(ratio=2), when={"contains": "approved"})
    _, record, run_dir = run_recorded_sync(gated.plan(INPUTS), tmp_path / "asked", pool=pool)
    assert record["status"] == "waiting" and record["waiting"][0]["node"] == "draft"
    result, record, _ = resume_run_sync(run_dir, pool=pool, answers={"draft": answer})
    assert result.status == "finished" and list(record["fired"].values()) == [hands_on]
    if not hands_on:
        assert "publish" in result.skipped and result.outputs == {}
        return
    (hop,) = record["hops"]  # the state, generated before the person answered: the answer is not in it
    draft = record["nodes"]["draft"]
    assert hop["kept_by_origin"] == {"draft": hop["kept_positions"]} and hop["total_positions"] == draft["positions"]
    assert answer not in record["nodes"]["publish"]["prompt_text"]


runner = CliRunner()


def test_the_cli_waits_with_exit_code_3_and_resume_answers(pool, tmp_path, monkeypatch):
    monkeypatch.setattr("rclc_graph.views.cli.default_pool", lambda: pool)
    topology = tmp_path / "hitl.yaml"
    spec = graph().spec()
    nodes = [node.model_copy(update={"call": f"{__name__}:approve"}) if node.call else node
             for node in spec.nodes]
    topology.write_text(to_yaml(spec.model_copy(update={"nodes": nodes})))
    inputs = tmp_path / "in.json"
    inputs.write_text(json.dumps(INPUTS))
    out = tmp_path / "runs"
    first = runner.invoke(app, ["run", str(topology), "--input", str(inputs), "--out", str(out), "--trust-code",
                                "--answer", "notes=keep it short"])
    assert first.exit_code == 3, first.output
    assert "Waiting for your answer" in first.output and "--answer draft=" in first.output
    (run_dir,) = list(out.iterdir())
    refused = runner.invoke(app, ["resume", str(run_dir), "--trust-code"])
    assert refused.exit_code == 2 and "waits for an answer" in refused.output
    second = runner.invoke(app, ["resume", str(run_dir), "--trust-code", "--json", "--answer", "draft=Looks fine.",
                                 "--answer", "gate=yes"])
    assert second.exit_code == 0, second.output
    summary = json.loads(second.stdout)
    assert summary["status"] == "finished" and summary["waiting"] == [] and set(summary["outputs"]) == {"gate", "final"}
    bad = runner.invoke(app, ["resume", str(run_dir), "--answer", "no-equals-sign"])
    assert bad.exit_code == 2 and "is not NODE=TEXT" in bad.output


# issue 24 defect D1: an interrupt showed the person text from senders whose edge did not fire
def test_a_waiting_node_shows_only_the_senders_whose_edges_fired():
    from rclc_graph import run_plan_sync
    from rclc_graph.testing import FakeExecutor

    graph = Graph("routed").input("q")
    graph.model("base").agent("a", model="base")
    graph.node("triage", agent="a", prompt="{q}")
    graph.node("billing", agent="a", prompt="billing")
    graph.node("other", agent="a", prompt="other")
    graph.node("review", agent="a", prompt="review: {answer}", interrupt="before", question="OK?", output=True)
    graph.edge("triage", "billing", TEXT, when={"contains": "bill"})
    graph.edge("triage", "other", TEXT)
    graph.edge("billing", "review", TEXT)
    graph.edge("other", "review", TEXT, when={"contains": "never said"})
    texts = {"triage": "about a bill", "billing": "refund 40", "other": "unrelated private note"}
    executor = FakeExecutor(text=lambda reading: texts.get(reading.node.name, "?"))
    result = run_plan_sync(graph.plan({"q": "q"}), executor=executor)
    assert result.status == "waiting"
    assert set(result.nodes) == {"triage", "billing", "other"}  # `other` finished, but its edge did not fire
    assert result.waiting == [{"node": "review", "question": "OK?", "interrupt": "before",
                               "shown": {"billing": "refund 40"}}]
