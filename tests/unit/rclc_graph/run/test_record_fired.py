"""record.json names conditional edges' decisions by "source->target" (issue 27), and records
written before (keyed by numeric plan edge id) still resume and draw. Agents run on a tiny
random model."""

from __future__ import annotations

import json

import pytest

from rclc_graph import Graph, ModelPool, Policy, read_record, resume_run_sync, run_recorded_sync
from rclc_graph.render.drawing import sketch_record
from rclc_graph.spec.models import ModelSpec


def gated() -> Graph:
    graph = Graph("gate").input("brief")
    graph.model("base").agent("a", model="base", max_new_tokens=3)
    graph.node("draft", agent="a", prompt="Brief: {brief}. Draft:")
    graph.node("never", agent="a", prompt="Never:", output=True)
    graph.node("review", agent="a", prompt="Review: {answer}", interrupt="before", question="Notes?")
    graph.node("final", agent="a", prompt="Final: {answer}", output=True, interrupt="before")
    graph.edge("draft", "never", Policy(ratio=2), when={"equals": "\u0000never"})
    graph.edge("draft", "review", Policy(ratio=2), when={"matches": "."})
    graph.edge("review", "final", Policy(ratio=2))
    return graph


@pytest.fixture
def pool(tiny_qwen3):
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *tiny_qwen3)
    return pool


def test_fired_is_keyed_by_source_and_target(pool, tmp_path):
    result, record, _ = run_recorded_sync(gated().plan({"brief": "b"}, answers={"review": "r", "final": "f"}),
                                          tmp_path, pool=pool)
    assert result.status == "finished", result.error
    assert record["fired"] == result.fired == {"draft->never": False, "draft->review": True}
    assert result.to_dict()["fired"] == record["fired"]


def test_a_record_keyed_by_edge_ids_still_resumes_and_draws(pool, tmp_path):
    _, record, run_dir = run_recorded_sync(gated().plan({"brief": "b"}, answers={"review": "r"}), tmp_path, pool=pool)
    assert record["status"] == "waiting" and record["waiting"][0]["node"] == "final"
    ids = {f"{edge['source']}->{edge['target']}": edge["id"] for edge in record["plan"]["edges"]}
    old = {str(ids[key]): decision for key, decision in record["fired"].items()}  # as the previous version wrote it
    record["fired"] = old
    (run_dir / "record.json").write_text(json.dumps(record))

    sketch = sketch_record(read_record(run_dir))
    idle = {(edge.source, edge.target) for edge in sketch.edges if edge.idle}
    assert idle == {("draft", "never")}

    result, resumed, _ = resume_run_sync(run_dir, pool=pool, answers={"final": "ok"})
    assert result.status == "finished", result.error
    assert resumed["fired"] == {"draft->never": False, "draft->review": True}  # rewritten in the new form
    assert resumed["attempts"][-1]["ran"] == ["final"]
