"""MCP tools against real MCP server processes written with the official SDK: stdio and
streamable HTTP, the shipped mcp_agent topology, error results, dead servers (never starts,
cannot be spawned, stays silent, crashes mid-call) and a cancelled run, each checked to leave
no server process behind.

The 135M embedded model seldom writes a tool call on its own (docs/graphs.md), so the
tool-calling node is scripted (tests/helpers/scripted_tools.py): it is made to write a JSON call,
then an answer; the call really goes to the server process and its result is appended to the
real model's state. One test runs the shipped topology unscripted through the CLI.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from rclc_graph import (DelegatingExecutor, EventStream, Graph, LocalExecutor, default_pool, plan_file,
                        run_recorded_sync)
from rclc_graph.executors.tools import result_text
from rclc_graph.run.record import read_record
from rclc_graph.run.scheduler import run_plan, run_plan_sync
from tests.helpers.scripted_tools import TOOL_AGENT_REPLIES, install, uninstall
from tests.paths import HELPERS, ROOT

pytestmark = pytest.mark.integration

SERVER = HELPERS / "mcp_test_server.py"
ANSWER = "The answer is 5."


def call(tool: str, **arguments) -> str:
    return json.dumps({"name": tool, "arguments": arguments})


@pytest.fixture
def scripted():
    """Script the node `solver`: `scripted(reply, ...)`; undone after the test."""
    def script(*replies: str) -> None:
        install({"solver": list(replies)})

    yield script
    uninstall()


@pytest.fixture
def pid_file(tmp_path, no_server_left):
    """Where every test server process writes its PID (a stdio server inherits only the few
    variables the SDK passes on, so the path goes through the server's `env`)."""
    return tmp_path / "pids.txt"


def server_pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def children() -> set[int]:
    """This process's child processes (a stdio server the run left behind would be one)."""
    found: set[int] = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(path, encoding="ascii") as handle:
                found |= {int(pid) for pid in handle.read().split()}
        except FileNotFoundError:  # the thread ended since the listing (its children were the process's)
            continue
    return found


@pytest.fixture
def no_server_left():
    """Fails the test if the run leaves a child process behind (servers are our children)."""
    before = children()
    yield
    assert children() - before == set()


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def stdio(pid_file: Path, *extra: str, **fields) -> dict:
    return {"command": "python", "args": [str(SERVER), *extra], "env": {"MCP_TEST_PID_FILE": str(pid_file)},
            **fields}


def solver_graph(server_fields: dict, *, max_tool_calls: int = 2, tool_timeout: float = 20.0) -> Graph:
    graph = Graph("mcp_calc").input("question")
    graph.model("base")
    graph.mcp_server("calc", **server_fields)
    graph.agent("solver", model="base", system="You solve arithmetic with the tools.", tools=["mcp:calc"],
                max_tool_calls=max_tool_calls, tool_timeout=tool_timeout, max_new_tokens=48)
    graph.node("solver", agent="solver", prompt="{question}", output=True)
    return graph


def run_with_events(plan):
    events = EventStream()
    seen: list = []

    async def main():
        async def consume():
            async for event in events:
                seen.append(event)

        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            result = await run_plan(plan, events=events)
            events.close()
        return result

    return anyio.run(main), seen


_EXPORTER: list = []


@pytest.fixture
def spans():
    """The spans runs report (the process's tracer provider, also exporting to memory)."""
    pytest.importorskip("opentelemetry.sdk")  # the `otel` extra; `make test` installs it
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    if not _EXPORTER:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _EXPORTER.append(InMemorySpanExporter())
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER[0]))
    _EXPORTER[0].clear()
    yield _EXPORTER[0]
    _EXPORTER[0].clear()


def test_a_stdio_server_s_tools_run_in_the_tool_loop_and_it_stops_with_the_run(scripted, pid_file, spans):
    fields = stdio(pid_file, tools=["add", "read_env"])
    fields["env"]["CALC_MODE"] = "exact"
    plan = solver_graph(fields).plan({"question": "What is 2 + 3?"}, trust_code=True)
    scripted(call("add", a=2, b=3), call("read_env", name="CALC_MODE"), ANSWER)
    result, events = run_with_events(plan)
    assert result.status == "finished", result.error
    node = result.nodes["solver"]
    assert node.text == ANSWER
    assert [(made["name"], made["arguments"], made["result"], made["error"]) for made in node.tool_calls] == [
        ("add", {"a": 2, "b": 3}, "5", None), ("read_env", {"name": "CALC_MODE"}, "exact", None)]
    # The model was shown the server's tools (its allowlist: two of five) with the server's schemas.
    assert "- add(a: integer, b: integer)" in node.prompt_text
    assert "- read_env(name: string)" in node.prompt_text and "crash" not in node.prompt_text
    tool_events = [event.payload for event in events if event.kind == "tool"]
    assert [(payload["phase"], payload["name"]) for payload in tool_events] == [
        ("call", "add"), ("result", "add"), ("call", "read_env"), ("result", "read_env")]
    assert [segment.kind for segment in node.lineage.segments] == ["prompt", "token", "tool", "token", "tool", "token"]
    assert {payload.get("server") for payload in tool_events if payload["phase"] == "call"} == {"calc"}
    # The calls' spans: execute_tool under the agent, and the SDK's own client span under each.
    exported = spans.get_finished_spans()
    [agent] = [span for span in exported if span.name == "invoke_agent solver"]
    tools = [span for span in exported if span.name.startswith("execute_tool ")]
    assert [span.name for span in tools] == ["execute_tool add", "execute_tool read_env"]
    for span in tools:
        assert span.parent.span_id == agent.context.span_id and span.attributes["rclc.tool.server"] == "calc"
        inner = [child for child in exported if child.parent is not None and child.parent.span_id == span.context.span_id]
        assert [child.name for child in inner] == [f"MCP send tools/call {span.attributes['gen_ai.tool.name']}"]
    assert len([span for span in exported if span.name.startswith("chat ")]) == 3  # call, call, answer
    assert_gone(server_pids(pid_file))


class _OutsideTheRunScope(DelegatingExecutor):
    """Runs each node as a replica does: without the scheduler's MCP servers."""

    async def run_node(self, ctx, node, inbound):
        return await self.inner.run_node(replace(ctx, tool_servers=None), node, inbound)


def test_a_node_run_outside_the_run_s_scope_starts_and_stops_its_own_server(scripted, pid_file):
    plan = solver_graph(stdio(pid_file)).plan({"question": "What is 2 + 3?"}, trust_code=True)
    scripted(call("add", a=2, b=3), ANSWER)
    result = run_plan_sync(plan, executor=_OutsideTheRunScope(LocalExecutor(default_pool())))
    assert result.status == "finished", result.error
    assert result.nodes["solver"].tool_calls[0]["result"] == "5"
    assert_gone(server_pids(pid_file))


def test_the_shipped_mcp_topology_gives_the_python_tool_s_result(scripted, tmp_path, no_server_left):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import shop_tools
    finally:
        sys.path.remove(str(ROOT / "examples"))
    install(TOOL_AGENT_REPLIES)  # the support node calls lookup_order(A-1002), then answers
    inputs = json.loads((ROOT / "examples" / "inputs" / "mcp_agent.json").read_text())
    plan = plan_file(ROOT / "topologies" / "mcp_agent.yaml", inputs, trust_code=True)
    result, record, run_dir = run_recorded_sync(plan, tmp_path, base_dir=ROOT / "topologies")
    assert result.status == "finished", result.error
    [made] = record["nodes"]["support"]["tool_calls"]
    assert (made["name"], made["error"]) == ("lookup_order", None)
    assert made["result"] == result_text(shop_tools.lookup_order("A-1002"))  # the same text a Python tool gives
    assert "PostNord" in made["result"]
    assert "lookup_order" in (run_dir / "report.html").read_text()


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    """The test server on streamable HTTP (a free loopback port, which it prints first)."""
    pids = tmp_path_factory.mktemp("http") / "pids.txt"
    process = subprocess.Popen([sys.executable, str(SERVER), "--http", "0"], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, MCP_TEST_PID_FILE=str(pids)))
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        process.stdout.close()


def test_a_streamable_http_server_s_tools_run_in_the_tool_loop(scripted, http_server):
    plan = solver_graph({"url": http_server}).plan({"question": "What is 2 + 3?"})  # reaching a server runs no code
    scripted(call("add", a=2, b=3), ANSWER)
    result = run_plan_sync(plan)
    assert result.status == "finished", result.error
    [made] = result.nodes["solver"].tool_calls
    assert (made["name"], made["result"], made["error"]) == ("add", "5", None)


def test_what_a_tool_reports_and_a_slow_call_are_error_results(scripted, pid_file):
    # 3 s: ten times what a call takes on a busy machine; the pause outlasts it tenfold
    plan = solver_graph(stdio(pid_file), tool_timeout=3.0).plan({"question": "1 / 0?"}, trust_code=True)
    scripted(call("divide", a=1, b=0), call("pause", seconds=30), "I cannot divide by zero.")
    result = run_plan_sync(plan)
    assert result.status == "finished", result.error
    divide, pause = result.nodes["solver"].tool_calls
    assert divide["error"] == "Error executing tool divide: cannot divide by zero"
    assert divide["result"] == f"error: {divide['error']}"
    assert pause["error"] == "TimeoutError: pause took longer than 3 s"
    assert result.nodes["solver"].text == "I cannot divide by zero."
    assert_gone(server_pids(pid_file))


def closed_port_url() -> tuple[socket.socket, str]:
    """A loopback URL nothing listens on (the socket holds the port, unlistening, until closed)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    return holder, f"http://127.0.0.1:{holder.getsockname()[1]}/mcp"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("exits", ["did not start", "cannot open its database", "run the command by hand"]),
        ("missing", ["could not be started", "FileNotFoundError", "names a program on PATH"]),
        ("silent", ["did not start within 3 s", "raise startup_timeout"]),
        ("refused", ["did not start", "start the server first"]),
    ],
)
def test_a_server_that_does_not_start_fails_the_node_naming_it_and_the_fix(pid_file, case, expected):
    holder = None
    if case == "exits":
        fields = stdio(pid_file, "--exit-at-start")
    elif case == "missing":
        fields = {"command": "rclc-graph-no-such-mcp-server"}
    elif case == "silent":
        fields = stdio(pid_file, "--silent", startup_timeout=3)
    else:
        holder, url = closed_port_url()
        fields = {"url": url}
    try:
        result = run_plan_sync(solver_graph(fields).plan({"question": "2 + 3?"}, trust_code=True))
    finally:
        if holder is not None:
            holder.close()
    assert (result.status, result.failed_node) == ("failed", "solver")
    assert "MCP server 'calc'" in result.error and "ToolServerFailed" in result.error
    for text in expected:
        assert text in result.error
    assert_gone(server_pids(pid_file))  # and no_server_left: no child process either


def test_a_server_that_dies_mid_call_fails_the_node_with_its_stderr(scripted, pid_file):
    plan = solver_graph(stdio(pid_file)).plan({"question": "2 + 3?"}, trust_code=True)
    scripted(call("crash"), ANSWER)
    result = run_plan_sync(plan)
    assert (result.status, result.failed_node) == ("failed", "solver")
    assert "MCP server 'calc'" in result.error and "stopped working while the run used it" in result.error
    assert "crash() called, exiting with status 7" in result.error  # its stderr, kept for the error
    assert_gone(server_pids(pid_file))


def test_a_cancelled_run_stops_its_server_even_during_a_call(scripted, pid_file):
    plan = solver_graph(stdio(pid_file), tool_timeout=120).plan({"question": "wait"}, trust_code=True)
    scripted(call("pause", seconds=120), ANSWER)
    events = EventStream()

    async def main():
        async with anyio.create_task_group() as group:
            async def cancel_once_the_call_is_made():
                async for event in events:
                    if event.kind == "tool" and event.payload["phase"] == "call":
                        group.cancel_scope.cancel()

            group.start_soon(cancel_once_the_call_is_made)
            await run_plan(plan, events=events)

    anyio.run(main)
    assert_gone(server_pids(pid_file))


def test_the_shipped_topology_runs_unscripted_on_the_embedded_model(tmp_path):
    """The one unscripted run: whatever the 135M model writes, the server starts, the run
    finishes, and the server is gone afterwards (its tool use is part B's measure)."""
    done = subprocess.run(
        [sys.executable, "-m", "rclc_graph", "run", "topologies/mcp_agent.yaml", "--input",
         "examples/inputs/mcp_agent.json", "--trust-code", "--out", str(tmp_path), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr
    (run_dir,) = [path for path in tmp_path.iterdir() if path.is_dir()]
    record = read_record(run_dir)
    assert record["status"] == "finished"
    assert record["outputs"]["reply"].strip()
