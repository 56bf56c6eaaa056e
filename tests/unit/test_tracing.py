"""OpenTelemetry spans (issue 15, item 4): one per run, node, hop and tool call, with the run
record's figures as attributes, read back from the SDK's in-memory exporter."""

from __future__ import annotations

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")  # the `otel` extra; `make test` installs it

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from rclc_graph import Graph, Policy  # noqa: E402
from rclc_graph.run.scheduler import run_plan, run_plan_sync  # noqa: E402
from rclc_graph.run.tracing import RunTracer  # noqa: E402
from rclc_graph.testing import FakeExecutor  # noqa: E402

EXPORTER = InMemorySpanExporter()
_INSTALLED: list[object] = []


@pytest.fixture
def spans():
    """The process's tracer provider (OpenTelemetry allows one per process: docs/streaming.md's
    example may have set it already), also exporting to our in-memory exporter."""
    if not _INSTALLED:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        _INSTALLED.append(provider)
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def plan():
    graph = Graph("traced").input("question").input("documents", "list[str]")
    graph.model("base").agent("reader", model="base")
    graph.node("w", agent="reader", prompt="{item}", foreach="documents", generate=False)
    graph.node("writer", agent="reader", prompt="Note on {question}:")
    graph.node("final", agent="reader", prompt="{question}", output=True)
    graph.edge("w", "writer", Policy(ratio=2))
    graph.edge("writer", "final", Policy(mode="text"))
    return graph.plan({"question": "Who owns Cedar?", "documents": ["one two three four five six", "seven eight"]})


def by_name(exported):
    return {span.name: span for span in exported}


def test_one_span_per_run_node_and_hop_with_the_records_figures(spans):
    result = run_plan_sync(plan(), executor=FakeExecutor())
    assert result.status == "finished"
    found = by_name(spans.get_finished_spans())
    run = found["rclc-graph run traced"]
    assert run.attributes["rclc.run_id"] == result.run_id and run.attributes["rclc.run.status"] == "finished"
    assert run.parent is None
    for name, node in result.nodes.items():
        span = found[f"node {name}"]
        assert span.parent.span_id == run.context.span_id
        assert span.attributes["rclc.node.positions"] == node.positions
        assert span.attributes["rclc.node.generation_seconds"] == node.generation_seconds
    assert len([span for span in spans.get_finished_spans() if span.name.startswith("hop ")]) == len(result.hops)
    for record in result.hops:
        span = found[f"hop {record.source} -> {record.target}"]
        assert span.parent.span_id == found[f"node {record.target}"].context.span_id
        attributes = span.attributes
        assert attributes["rclc.hop.total_positions"] == record.total_positions  # T
        assert attributes["rclc.hop.inherited_positions"] == record.inherited_positions  # I
        assert attributes["rclc.hop.budget"] == record.budget
        assert attributes["rclc.hop.kept_positions"] == record.kept_positions
        assert attributes["rclc.hop.payload_bytes"] == record.payload_bytes
        assert attributes["rclc.hop.selection_seconds"] == record.selection_seconds
        assert attributes["rclc.hop.generation_seconds"] == record.generation_seconds


def test_a_run_inside_a_callers_span_is_its_child(spans):
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        run_plan_sync(plan(), executor=FakeExecutor())
    run = by_name(spans.get_finished_spans())["rclc-graph run traced"]
    assert run.parent is not None and run.parent.span_id == request.get_span_context().span_id


def test_failed_and_cancelled_runs_end_their_spans_with_an_error_status(spans):
    run_plan_sync(plan(), executor=FakeExecutor(fail={"writer"}))
    found = by_name(spans.get_finished_spans())
    assert found["node writer"].status.status_code == trace.StatusCode.ERROR
    assert found["rclc-graph run traced"].attributes["rclc.run.status"] == "failed"
    spans.clear()

    async def cancel():
        with anyio.move_on_after(0.2):
            await run_plan(plan(), executor=FakeExecutor(hang="writer"))

    anyio.run(cancel)
    found = by_name(spans.get_finished_spans())
    assert found["rclc-graph run traced"].attributes["rclc.run.status"] == "cancelled"
    assert found["node writer"].attributes["rclc.node.status"] == "cancelled"


def test_tool_calls_and_skipped_nodes_get_spans(spans):
    tracer = RunTracer("r1")
    tracer.observe("run", {"status": "started", "plan": "tools", "nodes": 2, "resumed": 0})
    tracer.observe("node", {"node": "agent", "status": "started"})
    tracer.observe("tool", {"node": "agent", "phase": "call", "call_id": "c1", "name": "sql", "arguments": {}})
    tracer.observe("tool", {"node": "agent", "phase": "result", "call_id": "c1", "name": "sql", "result": None,
                            "error": "no such table"})
    tracer.observe("node", {"node": "agent", "status": "finished", "positions": 9, "generation_seconds": 0.5})
    tracer.observe("node", {"node": "other", "status": "skipped", "reason": "no edge fired"})
    tracer.observe("run", {"status": "finished", "seconds": 1.0})
    found = by_name(spans.get_finished_spans())
    tool = found["tool sql"]
    assert tool.parent.span_id == found["node agent"].context.span_id
    assert tool.attributes["rclc.tool.error"] == "no such table" and tool.status.status_code == trace.StatusCode.ERROR
    assert found["node other"].attributes["rclc.node.status"] == "skipped"


def test_a_broken_event_never_fails_the_run(spans, caplog):
    tracer = RunTracer("r2")
    tracer.observe("node", {"status": "started"})  # no node name: logged, not raised
    assert "tracing: could not record a node event of run r2" in caplog.text


def test_no_tracer_is_made_while_no_provider_is_set(monkeypatch):
    # Issue 28: with the API's default provider nothing would be recorded, so a run builds no
    # span and observes no event; a configured provider gets spans as before.
    from rclc_graph.run import tracing

    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    assert not tracing.tracing_configured() and tracing.run_tracer("r") is None
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: trace.NoOpTracerProvider())
    assert tracing.run_tracer("r") is None
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: TracerProvider())
    assert isinstance(tracing.run_tracer("r"), RunTracer)
