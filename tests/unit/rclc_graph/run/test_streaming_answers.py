"""People in the loop from Python while streaming (issue 27, item 1): `astream`, `stream`,
`astream_resume` and `stream_resume` take `answers=` (and `functions=`), so an application
streams a run until it waits, asks a person, and streams the continuation to its end in the
same process. Agents run on a tiny random model; the gate is a real function node."""

from __future__ import annotations

import anyio
import pytest

from rclc_graph import (
    Graph,
    Interrupt,
    ModelPool,
    Policy,
    ResumeError,
    astream,
    astream_resume,
    run_recorded_sync,
    stream,
    stream_resume,
)
from rclc_graph.errors import UsageError
from rclc_graph.spec.models import ModelSpec

INPUTS = {"brief": "Cedar works offline"}


def approve(inputs, senders):
    """Asks a person unless it has their answer."""
    if "answer" not in inputs:
        raise Interrupt("Publish this draft? (yes/no)")
    return {"published": inputs["answer"].strip().lower() == "yes"}


def graph() -> Graph:
    graph = Graph("hitl").input("brief")
    graph.model("base").agent("a", model="base", max_new_tokens=4)
    graph.node("notes", agent="a", prompt="Brief: {brief}. Notes: {answer}", interrupt="before",
               question="Any notes about {brief}?")
    graph.node("draft", agent="a", prompt="Draft:")
    graph.function("gate", approve, output=True)
    graph.edge("notes", "draft", Policy(ratio=2))
    graph.edge("draft", "gate")  # a plain edge into a function node carries the text
    return graph


@pytest.fixture
def pool(tiny_qwen3):
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *tiny_qwen3)
    return pool


def test_astream_to_waiting_then_answers_stream_it_to_finished(pool, tmp_path):
    built = graph()

    async def main():
        async with astream(built, INPUTS, out=tmp_path, pool=pool) as events:
            first = [event async for event in events]
        run_dir = events.run_dir
        asked = first[-1]
        async with astream_resume(run_dir, answers={asked.node: "keep it short"}, functions=built.functions,
                                  pool=pool) as events:
            second = [event async for event in events]
        gate = second[-1]
        async with astream_resume(run_dir, answers={gate.node: "yes"}, functions=built.functions,
                                  pool=pool) as events:
            third = [event async for event in events]
        return first, second, third, events

    first, second, third, events = anyio.run(main)
    assert [event.type for event in first][-2:] == ["node.waiting", "run.waiting"]
    assert (first[-1].node, first[-1].question) == ("notes", "Any notes about Cedar works offline?")
    assert second[-1].type == "run.waiting" and second[-1].node == "gate"
    assert second[0].type == "run.started" and "node.finished" in [event.type for event in second]
    assert third[-1].type == "run.finished" and third[0].resumed == 2  # notes and draft did not run again
    assert events.result.status == "finished" and events.result.outputs == {"gate": '{"published":true}'}
    assert events.record["answers"] == {"notes": "keep it short", "gate": "yes"}


def test_stream_and_stream_resume_are_the_sync_twins(pool, tmp_path):
    built = graph()
    with stream(built, INPUTS, out=tmp_path, pool=pool, answers={"notes": "short"}) as events:
        waiting = [event for event in events if event.type == "run.waiting"]
    assert [event.node for event in waiting] == ["gate"]  # notes was answered up front
    with stream_resume(events.run_dir, answers={"gate": "no"}, functions=built.functions, pool=pool) as resumed:
        last = list(resumed)[-1]
    assert last.type == "run.finished" and resumed.result.outputs == {"gate": '{"published":false}'}


def test_astream_answers_up_front_equal_plan_answers(pool, tmp_path):
    built = graph()
    answers = {"notes": "short", "gate": "yes"}

    async def main():
        async with astream(built, INPUTS, out=tmp_path / "a", pool=pool, answers=answers) as events:
            async for _ in events:
                pass
        return events.result

    streamed = anyio.run(main)
    planned, _, _ = run_recorded_sync(built.plan(INPUTS, answers=answers), tmp_path / "b", pool=pool)
    assert streamed.status == planned.status == "finished" and streamed.outputs == planned.outputs


def test_refusals_name_only_parameters_that_exist(pool, tmp_path):
    built = graph()
    _, _, run_dir = run_recorded_sync(built.plan(INPUTS), tmp_path, pool=pool)
    with pytest.raises(ResumeError) as refused:  # raised at the call, before anything runs
        astream_resume(run_dir, functions=built.functions, pool=pool)
    message = str(refused.value)
    assert "--answer notes=TEXT" in message and "answers={'notes': ...} to resume_run, astream_resume" in message
    with pytest.raises(UsageError, match="answers: a Plan is already compiled"):
        astream(built.plan(INPUTS), answers={"notes": "x"})


def test_a_run_of_python_functions_resumes_only_with_functions(pool, tmp_path):
    built = graph()
    _, _, run_dir = run_recorded_sync(built.plan(INPUTS, answers={"notes": "n"}), tmp_path, pool=pool)
    with pytest.raises(ResumeError, match="functions=graph.functions to resume_run, astream_resume or stream_resume"):
        astream_resume(run_dir, answers={"gate": "yes"}, pool=pool)
