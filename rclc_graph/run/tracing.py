"""OpenTelemetry spans of a run, made from its events: the run, each node and model call, each
hop and tool call, named and attributed as OpenTelemetry's GenAI semantic conventions say
(genai_spans.py), with rclc's own figures as `rclc.*` attributes beside them.

Optional: with the `otel` extra (opentelemetry-api) installed, every run reports spans to the
global tracer provider once the application configures an SDK (an OTLP exporter to Jaeger,
Tempo, Langfuse or Phoenix, say; docs/streaming.md shows how); until then a run makes no
tracer at all (`tracing_configured`). Without the package nothing is imported and nothing is done.

Spans are built from the events the scheduler publishes (plus each finished node's result,
which the scheduler hands over before its `node finished` event), so every executor (local,
replicas, Ray) is traced alike and tracing never changes what a run does:

    invoke_workflow <graph>         the run: gen_ai.workflow.name; rclc.run.* (run_id, status, seconds, nodes)
      invoke_agent <node>           an agent node: model, request settings, token usage; rclc.node.*
        hop <source> -> <target>    T, I, budget, kept, payload bytes, selection and generation seconds
        chat <model>                one generation: input and output tokens, finish reason
        execute_tool <tool>         gen_ai.tool.name, call id; rclc.tool.* (error)
      node <name>                   a function node, or a node that was skipped or waits for a person

A node's generations are told apart by its tool calls: a generation ends when its turn's
first call is published and the next starts when the last result is; their token counts and
inputs come from the node's lineage (prompt, token, tool, token, ...). A hop span covers its
selection (it ends when the receiver holds the delivery) and is written when its receiver
finishes, so it can carry the receiver's generation seconds as the record does. A node that
fails or is cancelled ends with an error status and `error.type`.

An agent's span is the current span in its node's task while the node runs, and a tool's
span while the tool runs, so spans others make meanwhile nest under them: the MCP SDK's client
spans (its server's start under the agent that needed it, each `tools/call` under its tool),
and whatever a tool traces itself.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import anyio

from ..executors.prompts import compose_content
from ..plan.dag import Plan, PlanNode
from . import genai_spans as genai

logger = logging.getLogger(__name__)

try:  # the optional `otel` extra
    from opentelemetry import context as otel_context
    from opentelemetry import trace
except ImportError:  # pragma: no cover - exercised by installs without the extra
    trace = None  # type: ignore[assignment]

TRACER_NAME = "rclc_graph"


def tracing_available() -> bool:
    """Whether opentelemetry-api is installed (the `otel` extra)."""
    return trace is not None


def _now() -> int:
    return time.time_ns()


def _attributes(prefix: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attributes: scalars as they are, None left out, anything else as text."""
    result: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, (bool, int, float, str)):
            result[f"{prefix}.{key}"] = value
        else:
            result[f"{prefix}.{key}"] = str(value)
    return result


@dataclass
class _NodeTrace:
    """One running node's span and what tells its generations apart."""

    span: Any
    plan_node: PlanNode | None
    generation_start: int
    in_tools: bool = False
    generations: list[tuple[int, int]] = field(default_factory=list)  # (start, end) ns of each closed one
    turn_calls: list[list[str]] = field(default_factory=list)  # call ids of each closed generation's turn
    tokens: int = 0
    failed: bool = False  # an error event named this node (its error.type is set)
    current: tuple[Any, Any] | None = None  # (context token, task) while its span is the current one


class RunTracer:
    """Turns one run's events into spans (see the module docstring). `observe` is called for
    every event as it is published, on the event loop; it never raises into the run."""

    def __init__(self, run_id: str, plan: Plan | None = None, seed: int = 0) -> None:
        self.run_id, self.plan, self.seed = run_id, plan, seed
        self.capture = genai.capture_content()
        self.tracer = trace.get_tracer(TRACER_NAME)  # type: ignore[union-attr]
        self.run_span: Any = None
        self.nodes: dict[str, _NodeTrace] = {}
        self.hops: dict[str, list[tuple[Mapping[str, Any], int]]] = {}
        self.tools: dict[str, tuple[Any, Any, Any]] = {}  # call id -> (span, context token, task)
        self.results: dict[str, tuple[Any, Any]] = {}  # node -> (inbound, NodeResult), until it finishes

    def observe(self, kind: str, payload: Mapping[str, Any]) -> None:
        try:
            self._observe(kind, payload)
        except Exception:  # a tracing fault must never fail a run
            logger.exception("tracing: could not record a %s event of run %s", kind, self.run_id)

    def node_result(self, name: str, inbound: Any, result: Any) -> None:
        """A node's result and the handoffs it read, just before its `node finished` event: what
        its model-call spans and opt-in messages are made from."""
        self.results[name] = (inbound, result)

    # -- events -> spans -------------------------------------------------------------------

    def _observe(self, kind: str, payload: Mapping[str, Any]) -> None:
        status = payload.get("status")
        if kind == "run" and status == "started":
            self._start_run(payload)
        elif kind == "run":
            self._end_run(str(status), payload)
        elif kind == "cancelled":
            self._end_run("cancelled", payload)
        elif kind == "node" and status == "started":
            self._start_node(payload["node"])
        elif kind == "node" and status == "finished":
            self._end_node(payload)
        elif kind == "node" and status in ("skipped", "waiting"):
            self._not_run(payload)
        elif kind == "hop":
            target = str(payload.get("target"))
            self.hops.setdefault(target, []).append((dict(payload), _now()))
            if target in self.nodes:  # its deliveries arrive before it generates
                self.nodes[target].generation_start = _now()
        elif kind == "token" and payload.get("node") in self.nodes:
            node = self.nodes[payload["node"]]
            node.tokens += 1
            node.in_tools = False
        elif kind == "tool" and payload.get("phase") == "call":
            self._start_tool(payload)
        elif kind == "tool":
            self._end_tool(payload)
        elif kind == "error":
            node = self.nodes.get(payload.get("node"))  # type: ignore[arg-type]
            if node is not None:
                self._fail(node.span, str(payload.get("message")))
                node.failed = True

    def _context(self, parent: Any) -> Any:
        return None if parent is None else trace.set_span_in_context(parent)  # type: ignore[union-attr]

    def _fail(self, span: Any, message: str, kind: str | None = None) -> None:
        span.set_attribute("error.type", kind or genai.error_type(message))
        span.set_status(trace.Status(trace.StatusCode.ERROR, message))  # type: ignore[union-attr]

    def _plan_node(self, name: str) -> PlanNode | None:
        if self.plan is None:
            return None
        try:
            return self.plan.node(name)
        except KeyError:
            return None

    # -- the run ----------------------------------------------------------------------------

    def _start_run(self, payload: Mapping[str, Any]) -> None:
        name = str(payload.get("plan"))
        self.run_span = self.tracer.start_span(
            f"invoke_workflow {name}",
            attributes={"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": name,
                        "rclc.run_id": self.run_id, **_attributes("rclc.run", {
                            "plan": payload.get("plan"), "nodes": payload.get("nodes"),
                            "resumed": payload.get("resumed")})},
        )

    def _end_run(self, status: str, payload: Mapping[str, Any]) -> None:
        for name in list(self.nodes):  # nodes still open: cancelled, failed, or not reached by a failure
            node = self.nodes.pop(name)
            node.span.set_attribute("rclc.node.status", "cancelled" if status == "cancelled" else "unfinished")
            if not node.failed:
                self._fail(node.span, f"run {status}", "cancelled" if status == "cancelled" else None)
            node.span.end()
        for span, _, _ in self.tools.values():
            span.end()
        self.tools.clear()
        if self.run_span is None:
            return
        self.run_span.set_attributes(_attributes("rclc.run", {"status": status, "seconds": payload.get("seconds"),
                                                              "node": payload.get("node")}))
        if status in ("failed", "cancelled"):
            message = str(payload.get("error") or f"run {status}")
            self._fail(self.run_span, message, "cancelled" if status == "cancelled" else None)
        self.run_span.end()
        self.run_span = None

    # -- nodes ------------------------------------------------------------------------------

    def _start_node(self, name: str) -> None:
        plan_node = self._plan_node(name)
        base = {"rclc.run_id": self.run_id, "rclc.node.name": name}
        if plan_node is not None and plan_node.is_function:
            span = self.tracer.start_span(f"node {name}", context=self._context(self.run_span),
                                          attributes={**base, "rclc.node.kind": "function"})
        else:
            attributes = {**base, "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
            if plan_node is not None:
                attributes.update(genai.agent_attributes(plan_node, self.run_id))
                attributes["rclc.node.agent"] = plan_node.agent.name  # type: ignore[union-attr]
            span = self.tracer.start_span(f"invoke_agent {name}", context=self._context(self.run_span),
                                          attributes=attributes)
        # Current in the node's task (which publishes its start and finish), so spans made while
        # it runs (an MCP server's start, a tool's own) nest under it.
        current = (otel_context.attach(trace.set_span_in_context(span)), _task())  # type: ignore[union-attr]
        self.nodes[name] = _NodeTrace(span, plan_node, _now(), current=current)

    def _not_run(self, payload: Mapping[str, Any]) -> None:
        name, status = payload["node"], payload.get("status")
        node = self.nodes.pop(name, None)
        span = node.span if node is not None else self.tracer.start_span(
            f"node {name}", context=self._context(self.run_span),
            attributes={"rclc.run_id": self.run_id, "rclc.node.name": name})
        span.set_attributes(_attributes("rclc.node", {"status": status, "reason": payload.get("reason"),
                                                      "question": payload.get("question")}))
        span.end()

    def _end_node(self, payload: Mapping[str, Any]) -> None:
        name = payload["node"]
        node = self.nodes.pop(name, None)
        inbound, result = self.results.pop(name, (None, None))
        if node is None:
            return
        _detach(node.current)
        span, finished = node.span, _now()
        generation = float(payload.get("generation_seconds") or 0.0)
        span.set_attributes(_attributes("rclc.node", {
            "status": "finished", "positions": payload.get("positions"),
            "inherited_positions": payload.get("inherited_positions"),
            "generated_tokens": payload.get("generated_tokens"), "generation_seconds": generation,
            "tokens_streamed": node.tokens}))
        for hop, delivered in self.hops.pop(name, []):
            self._hop_span(span, hop, delivered, generation)
        if node.plan_node is not None and not node.plan_node.is_function:
            node.generations.append((node.generation_start, finished))  # the last (or only) generation
            self._model_calls(node, payload, inbound, result)
        span.end(end_time=finished)

    def _hop_span(self, parent: Any, hop: Mapping[str, Any], delivered: int, generation: float) -> None:
        selection = float(hop.get("selection_seconds") or 0.0)
        attributes = _attributes("rclc.hop", {
            "edge": hop.get("edge"), "source": hop.get("source"), "target": hop.get("target"),
            "mode": hop.get("mode"), "policy": hop.get("policy"),
            "total_positions": hop.get("total_positions"), "inherited_positions": hop.get("inherited_positions"),
            "budget": hop.get("budget"), "kept_positions": hop.get("kept_positions"),
            "payload_bytes": hop.get("payload_bytes"), "crossed_bytes": hop.get("crossed_bytes"),
            "selection_seconds": selection,
            # as the record's row: the receiver's generation for a state/full hop, none for text
            "generation_seconds": 0.0 if hop.get("mode") == "text" else generation})
        hop_span = self.tracer.start_span(
            f"hop {hop.get('source')} -> {hop.get('target')}", context=self._context(parent),
            attributes=attributes, start_time=delivered - int(selection * 1e9))
        hop_span.end(end_time=delivered)

    # -- model calls ------------------------------------------------------------------------

    def _model_calls(self, node: _NodeTrace, payload: Mapping[str, Any], inbound: Any, result: Any) -> None:
        """One `chat <model>` span per generation, and the node's totals on its invoke_agent span."""
        plan_node = node.plan_node
        assert plan_node is not None and plan_node.agent is not None
        usage = _generation_usage(result, payload)
        if not usage:  # a node that only read its prompt and handoffs (generate: false)
            node.generations.clear()
        count = min(len(usage), len(node.generations))
        calls = {call.get("call_id"): call for call in (getattr(result, "tool_calls", None) or [])}
        turns = [[calls[call_id] for call_id in ids if call_id in calls] for ids in node.turn_calls]
        content = compose_content(plan_node, inbound) if self.capture and inbound is not None else ""
        outputs: list[dict[str, Any]] = []
        reasons: list[str] = []
        for index in range(count):
            inputs, tokens = usage[index]
            turn = turns[index] if index < len(turns) else []  # the last generation called no tool
            reason = genai.finish_reason(tokens, plan_node.agent.max_new_tokens, called_tools=bool(turn))
            reasons.append(reason)
            attributes = genai.chat_attributes(plan_node, self.run_id, input_tokens=inputs, output_tokens=tokens,
                                               finish=reason)
            attributes.update(genai.request_attributes(plan_node, self.seed))
            if self.capture:
                message = genai.output_message(payload.get("text"), turn, reason)
                outputs.append(message)
                attributes.update(genai.system_instructions(plan_node.agent.system))
                attributes.update(genai.messages_attributes(genai.conversation(content, turns[:index]), [message]))
            start, end = node.generations[index]
            kind = trace.SpanKind.INTERNAL if genai.in_process(plan_node) else trace.SpanKind.CLIENT  # type: ignore[union-attr]
            chat = self.tracer.start_span(f"chat {genai.model_name(plan_node)}", context=self._context(node.span),
                                          kind=kind, attributes=attributes, start_time=start)
            chat.end(end_time=end)
        known = [inputs for inputs, _ in usage if inputs is not None]
        node.span.set_attributes({
            **({"gen_ai.usage.input_tokens": sum(known)} if len(known) == len(usage) else {}),
            "gen_ai.usage.output_tokens": sum(tokens for _, tokens in usage),
            **({"gen_ai.response.finish_reasons": (reasons[-1],)} if reasons else {}),
            **genai.request_attributes(plan_node, self.seed),
        })
        if self.capture:
            node.span.set_attributes({**genai.system_instructions(plan_node.agent.system),
                                      **genai.messages_attributes(genai.conversation(content, []), outputs[-1:])})

    # -- tool calls ---------------------------------------------------------------------------

    def _start_tool(self, payload: Mapping[str, Any]) -> None:
        node = self.nodes.get(payload.get("node"))  # type: ignore[arg-type]
        call_id, now = str(payload.get("call_id")), _now()
        if node is not None:
            if not node.in_tools:  # the turn's first call ends its generation
                node.generations.append((node.generation_start, now))
                node.turn_calls.append([])
                node.in_tools = True
            node.turn_calls[-1].append(call_id)
        name = payload.get("name")
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": str(name),
                      "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": "function",
                      **_attributes("rclc.tool", {"name": name, "call_id": call_id, "node": payload.get("node"),
                                                  "server": payload.get("server")})}
        if self.capture:
            attributes.update(genai.tool_arguments(payload.get("arguments")))
        span = self.tracer.start_span(f"execute_tool {name}", context=self._context(node and node.span),
                                      attributes=attributes, start_time=now)
        # Current while the tool runs (the node's task publishes its call and result), so spans a
        # tool or an MCP client makes nest under it, and an MCP call carries this trace onward.
        self.tools[call_id] = (span, otel_context.attach(trace.set_span_in_context(span)), _task())  # type: ignore[union-attr]

    def _end_tool(self, payload: Mapping[str, Any]) -> None:
        entry = self.tools.pop(str(payload.get("call_id")), None)
        node, now = self.nodes.get(payload.get("node")), _now()  # type: ignore[arg-type]
        if node is not None:
            node.generation_start = now  # the next generation starts once the results are in
        if entry is None:
            return
        span, token, task = entry
        _detach((token, task))
        if payload.get("error"):
            error = str(payload["error"])
            span.set_attribute("rclc.tool.error", error)
            self._fail(span, error)
        elif self.capture:
            span.set_attributes(genai.tool_result(payload.get("result")))
        span.end(end_time=now)


def _detach(current: tuple[Any, Any] | None) -> None:
    """Undo a span's `attach`, in the task that attached it only (elsewhere it was never current)."""
    if current is not None and current[1] == _task():
        otel_context.detach(current[0])


def _task() -> tuple[int, Any]:
    """Where code runs: this thread, and its anyio task if it runs on an event loop."""
    try:
        task = anyio.get_current_task().id
    except Exception:  # no event loop in this thread: synchronous code
        task = None
    return threading.get_ident(), task


def _generation_usage(result: Any, payload: Mapping[str, Any]) -> list[tuple[int | None, int]]:
    """(input tokens, output tokens) of each generation of a node: each token run of its own
    lineage, with every position before it as its input. A node whose lineage holds no tokens
    (an API model keeps no state) or without a result: its one total, the input unknown when
    it holds no positions."""
    usage: list[tuple[int | None, int]] = []
    lineage = getattr(result, "lineage", None)
    if lineage is not None:
        before = 0
        for segment in lineage.segments:
            if segment.kind == "token" and segment.node == result.node:
                usage.append((before, segment.length))
            before += segment.length
    generated = int(getattr(result, "generated_tokens", None) or payload.get("generated_tokens") or 0)
    if not usage and generated:
        positions = int(getattr(result, "positions", None) or payload.get("positions") or 0)
        usage.append((positions - generated if positions else None, generated))
    return usage


def tracing_configured() -> bool:
    """Whether spans would be recorded: opentelemetry-api is installed and the application
    set a tracer provider (the API's default proxy and no-op providers record nothing)."""
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def run_tracer(run_id: str, plan: Plan | None = None, seed: int = 0) -> RunTracer | None:
    """A tracer for one run; None without opentelemetry-api or while no tracer provider is
    set, so a run nobody traces builds no span and observes no event (a provider set later
    traces the runs that start after it)."""
    return RunTracer(run_id, plan, seed) if tracing_configured() else None
