"""Run a topology with its spans exported over OTLP/HTTP, to any OpenTelemetry trace viewer.

    pip install opentelemetry-exporter-otlp-proto-http     # beside the `otel` extra
    python examples/otlp_traces.py topologies/mcp_agent.yaml examples/inputs/mcp_agent.json --trust-code
    python examples/otlp_traces.py ... --endpoint http://127.0.0.1:6006/v1/traces   # the default: Phoenix's

The spans follow OpenTelemetry's GenAI semantic conventions (docs/streaming.md#traces-opentelemetry):
invoke_workflow, invoke_agent, chat, execute_tool, and rclc's hop spans. Message content is
recorded only with OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true. The run is recorded
under runs/ as `rclc-graph run` records it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from rclc_graph import plan_file, run_recorded_sync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topology", type=Path)
    parser.add_argument("inputs", type=Path, help="a JSON file of the run's inputs")
    parser.add_argument("--endpoint", default="http://127.0.0.1:6006/v1/traces", help="the OTLP/HTTP traces URL")
    parser.add_argument("--service", default="rclc-graph", help="service.name of the spans")
    parser.add_argument("--trust-code", action="store_true", help="the topology names code (tools, MCP commands)")
    parser.add_argument("--out", type=Path, default=Path("runs"))
    arguments = parser.parse_args()

    provider = TracerProvider(resource=Resource.create({"service.name": arguments.service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=arguments.endpoint)))
    trace.set_tracer_provider(provider)

    inputs = json.loads(arguments.inputs.read_text())
    plan = plan_file(arguments.topology, inputs, trust_code=arguments.trust_code)
    result, _, run_dir = run_recorded_sync(plan, arguments.out, base_dir=arguments.topology.resolve().parent)
    provider.shutdown()  # flush every span before the process ends
    print(json.dumps({"status": result.status, "run_dir": str(run_dir), "outputs": result.outputs}, indent=2))


if __name__ == "__main__":
    main()
