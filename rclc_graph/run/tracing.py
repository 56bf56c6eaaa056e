"""OpenTelemetry spans of a run, made from its events: one per run, node, hop and tool call.

Optional: with the `otel` extra (opentelemetry-api) installed, every run reports spans to the
global tracer provider, which does nothing until the application configures an SDK (an OTLP
exporter to Jaeger, Tempo, Langfuse or Phoenix, say; docs/streaming.md shows how). Without
the package nothing is imported and nothing is done.

Spans are built from the events the scheduler publishes, so every executor (local, replicas,
Ray) is traced alike and tracing never changes what a run does:

    rclc-graph run <plan>          run_id, status, seconds, nodes, resumed
      node <name>                  positions, inherited, generated tokens, generation seconds
        hop <source> -> <target>   T, I, budget, kept, payload bytes, selection and generation seconds
        tool <name>                call id, error

A hop span covers its selection (it ends when the receiver holds the delivery) and is written
when its receiver finishes, so it can carry the receiver's generation seconds as the record
does. A node that fails or is cancelled ends with an error status.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

logger = logging.getLogger(__name__)

try:  # the optional `otel` extra
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


class RunTracer:
    """Turns one run's events into spans (see the module docstring). `observe` is called for
    every event as it is published, on the event loop; it never raises into the run."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.tracer = trace.get_tracer(TRACER_NAME)  # type: ignore[union-attr]
        self.run_span: Any = None
        self.nodes: dict[str, Any] = {}
        self.hops: dict[str, list[tuple[Mapping[str, Any], int]]] = {}
        self.tools: dict[str, Any] = {}
        self.tokens: dict[str, int] = {}

    def observe(self, kind: str, payload: Mapping[str, Any]) -> None:
        try:
            self._observe(kind, payload)
        except Exception:  # a tracing fault must never fail a run
            logger.exception("tracing: could not record a %s event of run %s", kind, self.run_id)

    # -- events -> spans -------------------------------------------------------------------

    def _observe(self, kind: str, payload: Mapping[str, Any]) -> None:
        status = payload.get("status")
        if kind == "run" and status == "started":
            self.run_span = self.tracer.start_span(
                f"rclc-graph run {payload.get('plan')}",
                attributes={"rclc.run_id": self.run_id, **_attributes("rclc.run", {
                    "plan": payload.get("plan"), "nodes": payload.get("nodes"), "resumed": payload.get("resumed")})},
            )
        elif kind == "run":
            self._end_run(str(status), payload)
        elif kind == "cancelled":
            self._end_run("cancelled", payload)
        elif kind == "node" and status == "started":
            self.nodes[payload["node"]] = self.tracer.start_span(
                f"node {payload['node']}", context=self._context(self.run_span),
                attributes={"rclc.run_id": self.run_id, "rclc.node.name": payload["node"]},
            )
        elif kind == "node" and status == "finished":
            self._end_node(payload)
        elif kind == "node" and status in ("skipped", "waiting"):
            span = self.nodes.pop(payload["node"], None) or self.tracer.start_span(
                f"node {payload['node']}", context=self._context(self.run_span),
                attributes={"rclc.run_id": self.run_id, "rclc.node.name": payload["node"]})
            span.set_attributes(_attributes("rclc.node", {"status": status, "reason": payload.get("reason"),
                                                          "question": payload.get("question")}))
            span.end()
        elif kind == "hop":
            self.hops.setdefault(str(payload.get("target")), []).append((dict(payload), _now()))
        elif kind == "token":
            self.tokens[payload["node"]] = self.tokens.get(payload["node"], 0) + 1
        elif kind == "tool" and payload.get("phase") == "call":
            self.tools[str(payload.get("call_id"))] = self.tracer.start_span(
                f"tool {payload.get('name')}", context=self._context(self.nodes.get(payload.get("node"))),
                attributes=_attributes("rclc.tool", {"name": payload.get("name"), "call_id": payload.get("call_id"),
                                                     "node": payload.get("node")}),
            )
        elif kind == "tool":
            span = self.tools.pop(str(payload.get("call_id")), None)
            if span is not None:
                if payload.get("error"):
                    span.set_attribute("rclc.tool.error", str(payload["error"]))
                    span.set_status(trace.Status(trace.StatusCode.ERROR, str(payload["error"])))  # type: ignore[union-attr]
                span.end()
        elif kind == "error":
            span = self.nodes.get(payload.get("node"))  # type: ignore[arg-type]
            if span is not None:
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(payload.get("message"))))  # type: ignore[union-attr]

    def _context(self, parent: Any) -> Any:
        return None if parent is None else trace.set_span_in_context(parent)  # type: ignore[union-attr]

    def _end_node(self, payload: Mapping[str, Any]) -> None:
        name = payload["node"]
        span = self.nodes.pop(name, None)
        if span is None:
            return
        generation = float(payload.get("generation_seconds") or 0.0)
        span.set_attributes(_attributes("rclc.node", {
            "status": "finished", "positions": payload.get("positions"),
            "inherited_positions": payload.get("inherited_positions"),
            "generated_tokens": payload.get("generated_tokens"), "generation_seconds": generation,
            "tokens_streamed": self.tokens.pop(name, 0)}))
        for hop, delivered in self.hops.pop(name, []):
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
                f"hop {hop.get('source')} -> {hop.get('target')}", context=self._context(span),
                attributes=attributes, start_time=delivered - int(selection * 1e9))
            hop_span.end(end_time=delivered)
        span.end()

    def _end_run(self, status: str, payload: Mapping[str, Any]) -> None:
        for name in list(self.nodes):  # nodes still open: cancelled, or not reached by a failure
            span = self.nodes.pop(name)
            span.set_attribute("rclc.node.status", "cancelled" if status == "cancelled" else "unfinished")
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"run {status}"))  # type: ignore[union-attr]
            span.end()
        for span in self.tools.values():
            span.end()
        self.tools.clear()
        if self.run_span is None:
            return
        self.run_span.set_attributes(_attributes("rclc.run", {"status": status, "seconds": payload.get("seconds"),
                                                              "node": payload.get("node")}))
        if status in ("failed", "cancelled"):
            message = payload.get("error") or f"run {status}"
            self.run_span.set_status(trace.Status(trace.StatusCode.ERROR, str(message)))  # type: ignore[union-attr]
        self.run_span.end()
        self.run_span = None


def tracing_configured() -> bool:
    """Whether spans would be recorded: opentelemetry-api is installed and the application
    set a tracer provider (the API's default proxy and no-op providers record nothing)."""
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def run_tracer(run_id: str) -> RunTracer | None:
    """A tracer for one run; None without opentelemetry-api or while no tracer provider is
    set, so a run nobody traces builds no span and observes no event (a provider set later
    traces the runs that start after it)."""
    return RunTracer(run_id) if tracing_configured() else None
