"""OpenTelemetry spans (issue 15, item 4; GenAI semantic conventions, issue 27): one per run,
node, hop, model call and tool call, with the run record's figures as `rclc.*` attributes and
the `gen_ai.*` ones beside them, read back from the SDK's in-memory exporter."""

from __future__ import annotations

import json

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

from tests.helpers.graph_runs import cancelled_once_started  # noqa: E402

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
    run = found["invoke_workflow traced"]
    assert run.attributes["rclc.run_id"] == result.run_id and run.attributes["rclc.run.status"] == "finished"
    assert run.parent is None
    for name, node in result.nodes.items():
        span = found[f"invoke_agent {name}"]
        assert span.parent.span_id == run.context.span_id
        assert span.attributes["rclc.node.positions"] == node.positions
        assert span.attributes["rclc.node.generation_seconds"] == node.generation_seconds
    assert len([span for span in spans.get_finished_spans() if span.name.startswith("hop ")]) == len(result.hops)
    for record in result.hops:
        span = found[f"hop {record.source} -> {record.target}"]
        assert span.parent.span_id == found[f"invoke_agent {record.target}"].context.span_id
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
    run = by_name(spans.get_finished_spans())["invoke_workflow traced"]
    assert run.parent is not None and run.parent.span_id == request.get_span_context().span_id


def test_failed_and_cancelled_runs_end_their_spans_with_an_error_status(spans):
    run_plan_sync(plan(), executor=FakeExecutor(fail={"writer"}))
    found = by_name(spans.get_finished_spans())
    assert found["invoke_agent writer"].status.status_code == trace.StatusCode.ERROR
    assert found["invoke_agent writer"].attributes["error.type"] == "RuntimeError"  # "writer broke"
    assert found["invoke_workflow traced"].attributes["rclc.run.status"] == "failed"
    spans.clear()

    async def cancel():  # once the hanging writer started (not after a delay: the machine may be slow)
        return await cancelled_once_started(
            "writer", lambda events: run_plan(plan(), executor=FakeExecutor(hang="writer"), events=events))

    assert anyio.run(cancel)
    found = by_name(spans.get_finished_spans())
    assert found["invoke_workflow traced"].attributes["rclc.run.status"] == "cancelled"
    assert found["invoke_agent writer"].attributes["rclc.node.status"] == "cancelled"
    assert found["invoke_agent writer"].attributes["error.type"] == "cancelled"


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
    tool = found["execute_tool sql"]
    assert tool.parent.span_id == found["invoke_agent agent"].context.span_id
    assert tool.attributes["rclc.tool.error"] == "no such table" and tool.status.status_code == trace.StatusCode.ERROR
    assert found["node other"].attributes["rclc.node.status"] == "skipped"


def test_a_broken_event_never_fails_the_run(spans, caplog):
    tracer = RunTracer("r2")
    tracer.observe("node", {"status": "started"})  # no node name: logged, not raised
    assert "tracing: could not record a node event of run r2" in caplog.text


# -- GenAI semantic conventions (issue 27) ----------------------------------------------------------

from rclc.models import EMBEDDED_CHECKPOINT  # noqa: E402
from rclc_graph.results.lineage import Lineage  # noqa: E402
from rclc_graph.results.run_result import NodeResult  # noqa: E402
from rclc_graph.run.genai_spans import CAPTURE_CONTENT_ENV  # noqa: E402


def children(exported, parent):
    return sorted(span.name for span in exported
                  if span.parent is not None and span.parent.span_id == parent.context.span_id)


def test_workflow_agent_and_model_call_spans_carry_the_genai_attributes(spans, monkeypatch):
    monkeypatch.delenv(CAPTURE_CONTENT_ENV, raising=False)
    result = run_plan_sync(plan(), executor=FakeExecutor())
    found = by_name(spans.get_finished_spans())
    run = found["invoke_workflow traced"]
    assert (run.attributes["gen_ai.operation.name"], run.attributes["gen_ai.workflow.name"]) == ("invoke_workflow",
                                                                                                 "traced")
    for name in ("writer", "final"):
        node, agent = result.nodes[name], found[f"invoke_agent {name}"]
        expected = {"gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": "huggingface",
                    "gen_ai.agent.name": name, "gen_ai.request.model": EMBEDDED_CHECKPOINT,
                    "gen_ai.request.max_tokens": 128, "gen_ai.conversation.id": result.run_id,
                    "gen_ai.usage.input_tokens": node.positions - node.generated_tokens,
                    "gen_ai.usage.output_tokens": node.generated_tokens, "rclc.node.agent": "reader"}
        assert {key: agent.attributes[key] for key in expected} == expected
        assert agent.attributes["gen_ai.response.finish_reasons"] == ("stop",)
        assert children(spans.get_finished_spans(), agent).count(f"chat {EMBEDDED_CHECKPOINT}") == 1
    chats = [span for span in spans.get_finished_spans() if span.name.startswith("chat ")]
    assert len(chats) == 2  # one generation each for writer and final; the foreach readers only read
    assert {chat.kind for chat in chats} == {trace.SpanKind.INTERNAL}  # the model runs in this process
    final = found["invoke_agent final"]
    [chat] = [span for span in chats if span.parent.span_id == final.context.span_id]
    assert {key: chat.attributes[key] for key in ("gen_ai.operation.name", "gen_ai.usage.input_tokens",
                                                  "gen_ai.usage.output_tokens")} == {
        "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": final.attributes["gen_ai.usage.input_tokens"],
        "gen_ai.usage.output_tokens": result.nodes["final"].generated_tokens}
    assert "gen_ai.usage.output_tokens" not in found["invoke_agent w[0]"].attributes or \
        found["invoke_agent w[0]"].attributes["gen_ai.usage.output_tokens"] == 0
    for span in spans.get_finished_spans():  # no content without the opt-in
        assert not {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions"} & set(
            span.attributes)


def tool_plan():
    graph = Graph("tools").input("question")
    graph.model("base").agent("support", model="base", system="Use the tools.", tools=["tests.helpers.tools:project_owner"],
                              temperature=0.5, max_new_tokens=16)
    graph.node("support", agent="support", prompt="{question}", output=True)
    return graph.plan({"question": "Who owns Cedar?"}, trust_code=True)


def traced_tool_loop(plan, *, error=None):
    """Drive a tracer through a tool loop's events: 3 tokens, a call, its result, 2 tokens."""
    tracer = RunTracer("r3", plan, seed=7)
    tracer.observe("run", {"status": "started", "plan": "tools", "nodes": 1, "resumed": 0})
    tracer.observe("node", {"node": "support", "status": "started"})
    for index in range(3):
        tracer.observe("token", {"node": "support", "index": index, "text": "x"})
    tracer.observe("tool", {"node": "support", "phase": "call", "call_id": "support#1", "name": "project_owner",
                            "arguments": {"project": "Cedar"}})
    inner = trace.get_tracer("test").start_span("inside the tool")  # a span the tool (or an MCP client) makes
    inner.end()
    tracer.observe("tool", {"node": "support", "phase": "result", "call_id": "support#1", "name": "project_owner",
                            "result": '{"owner": "Alice"}', "error": error})
    for index in range(3, 5):
        tracer.observe("token", {"node": "support", "index": index, "text": "y"})
    lineage = Lineage.fresh("support", 10).extend("support", 3, "token").extend("support", 6, "tool")
    lineage = lineage.extend("support", 2, "token")
    call = {"call_id": "support#1", "name": "project_owner", "arguments": {"project": "Cedar"},
            "result": '{"owner": "Alice"}', "error": error, "seconds": 0.1, "form": "json"}
    result = NodeResult(node="support", text="Alice owns Cedar.", positions=21, inherited_positions=0,
                        lineage=lineage, prompt_text="p", prompt_start=0, prompt_offsets=[], generated_tokens=5,
                        tool_calls=[call])
    tracer.node_result("support", [], result)
    tracer.observe("node", {"node": "support", "status": "finished", "positions": 21, "generated_tokens": 5,
                            "text": "Alice owns Cedar."})
    tracer.observe("run", {"status": "finished", "seconds": 1.0})


def test_a_tool_loop_gives_a_model_call_span_per_generation_around_its_tool_span(spans, monkeypatch):
    monkeypatch.delenv(CAPTURE_CONTENT_ENV, raising=False)
    traced = tool_plan()
    traced_tool_loop(traced)
    exported = spans.get_finished_spans()
    agent = by_name(exported)["invoke_agent support"]
    first, second = sorted((span for span in exported if span.name.startswith("chat ")), key=lambda s: s.start_time)
    tool = by_name(exported)["execute_tool project_owner"]
    assert {first.parent.span_id, second.parent.span_id, tool.parent.span_id} == {agent.context.span_id}
    assert first.end_time <= tool.start_time and tool.end_time <= second.start_time
    assert (first.attributes["gen_ai.usage.input_tokens"], first.attributes["gen_ai.usage.output_tokens"]) == (10, 3)
    assert (second.attributes["gen_ai.usage.input_tokens"], second.attributes["gen_ai.usage.output_tokens"]) == (19, 2)
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_call",)
    assert second.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    seed = traced.node("support").sampling_seed(7)  # the seed the generation used (run seed 7)
    assert (first.attributes["gen_ai.request.temperature"], first.attributes["gen_ai.request.seed"]) == (0.5, seed)
    assert (agent.attributes["gen_ai.usage.input_tokens"], agent.attributes["gen_ai.usage.output_tokens"]) == (29, 5)
    assert {key: tool.attributes[key] for key in ("gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.id",
                                                  "gen_ai.tool.type", "rclc.tool.call_id")} == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "project_owner",
        "gen_ai.tool.call.id": "support#1", "gen_ai.tool.type": "function", "rclc.tool.call_id": "support#1"}
    assert "gen_ai.tool.call.arguments" not in tool.attributes and "gen_ai.tool.call.result" not in tool.attributes
    assert by_name(exported)["inside the tool"].parent.span_id == tool.context.span_id  # current while it runs
    assert trace.get_current_span() is trace.INVALID_SPAN  # and only then: nothing stays attached


def test_message_content_is_recorded_only_when_the_user_opts_in(spans, monkeypatch):
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    traced_tool_loop(tool_plan())
    exported = spans.get_finished_spans()
    first, second = sorted((span for span in exported if span.name.startswith("chat ")), key=lambda s: s.start_time)
    tool = by_name(exported)["execute_tool project_owner"]
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"project": "Cedar"}
    assert tool.attributes["gen_ai.tool.call.result"] == '{"owner": "Alice"}'
    assert json.loads(first.attributes["gen_ai.system_instructions"]) == [{"type": "text", "content": "Use the tools."}]
    user = {"role": "user", "parts": [{"type": "text", "content": "Who owns Cedar?"}]}
    assert json.loads(first.attributes["gen_ai.input.messages"]) == [user]
    call_part = {"type": "tool_call", "id": "support#1", "name": "project_owner", "arguments": {"project": "Cedar"}}
    assert json.loads(first.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [call_part], "finish_reason": "tool_call"}]
    assert json.loads(second.attributes["gen_ai.input.messages"]) == [
        user, {"role": "assistant", "parts": [call_part]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "support#1", "response": '{"owner": "Alice"}'}]}]
    assert json.loads(second.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Alice owns Cedar."}], "finish_reason": "stop"}]
    agent = by_name(exported)["invoke_agent support"]
    assert json.loads(agent.attributes["gen_ai.output.messages"])[0]["parts"][0]["content"] == "Alice owns Cedar."
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "false")
    spans.clear()
    traced_tool_loop(tool_plan())
    assert all("gen_ai.input.messages" not in span.attributes for span in spans.get_finished_spans())


def test_a_failed_tool_call_sets_error_type(spans):
    traced_tool_loop(tool_plan(), error="TimeoutError: project_owner took longer than 1 s")
    tool = by_name(spans.get_finished_spans())["execute_tool project_owner"]
    assert tool.attributes["error.type"] == "TimeoutError" and tool.status.status_code == trace.StatusCode.ERROR


def test_an_api_model_s_call_is_a_client_span_on_its_server(spans):
    graph = Graph("api").input("question")
    graph.model("remote", backend="openai", base_url="http://127.0.0.1:8123/v1", model="qwen3-8b")
    graph.agent("writer", model="remote", max_new_tokens=32).node("w", agent="writer", prompt="{question}", output=True)
    tracer = RunTracer("r4", graph.plan({"question": "Hi?"}))
    tracer.observe("run", {"status": "started", "plan": "api", "nodes": 1, "resumed": 0})
    tracer.observe("node", {"node": "w", "status": "started"})
    result = NodeResult(node="w", text="Hello.", positions=0, inherited_positions=0, lineage=Lineage(),
                        prompt_text="[]", prompt_start=0, prompt_offsets=[], generated_tokens=4)
    tracer.node_result("w", [], result)
    tracer.observe("node", {"node": "w", "status": "finished", "positions": 0, "generated_tokens": 4, "text": "Hello."})
    tracer.observe("run", {"status": "finished", "seconds": 1.0})
    found = by_name(spans.get_finished_spans())
    chat = found["chat qwen3-8b"]
    assert chat.kind == trace.SpanKind.CLIENT
    expected = {"gen_ai.provider.name": "openai", "gen_ai.request.model": "qwen3-8b", "server.address": "127.0.0.1",
                "server.port": 8123, "gen_ai.usage.output_tokens": 4, "gen_ai.request.max_tokens": 32}
    assert {key: chat.attributes[key] for key in expected} == expected
    assert "gen_ai.usage.input_tokens" not in chat.attributes  # the server counts the request, not us
    assert found["invoke_agent w"].attributes["gen_ai.provider.name"] == "openai"


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
