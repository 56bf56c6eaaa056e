"""MCP servers in a topology, without starting one: the `mcp_servers` fields, agents' `mcp:<server>`
tool references, the whole-graph checks (declared servers, trust_code for commands), YAML
locations, the builder and its YAML round trip, the JSON Schema editors get, and how a
server's results read to the model."""

from __future__ import annotations

import pytest
import yaml

from rclc_graph import Graph, PlanError, SpecError, load_graph_text
from rclc_graph.executors.mcp_servers import McpServers, servers_for, uses_mcp
from rclc_graph.spec.models import AgentSpec, McpServerSpec, json_schema, mcp_server_name


def server(**fields):
    return Graph("g").mcp_server("shop", **fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "exactly one of command (stdio) and url (streamable HTTP)"),
        ({"command": "python", "url": "http://127.0.0.1:1/mcp"}, "exactly one of command"),
        ({"url": "http://example.com/mcp"}, "is not on this machine"),
        ({"url": "http://10.0.0.5:8000/mcp"}, "is not on this machine"),
        ({"url": "ftp://127.0.0.1/mcp"}, "is not an http(s) URL"),
        ({"url": "127.0.0.1:8000"}, "is not an http(s) URL"),
        ({"url": "http://127.0.0.1:1/mcp", "args": ["x"]}, "args apply to a stdio command only"),
        ({"url": "http://127.0.0.1:1/mcp", "cwd": "."}, "cwd apply to a stdio command only"),
        ({"command": "python", "env": {"BAD NAME": "1"}}, "is not an environment variable name"),
        ({"command": "python", "tools": []}, "tools is an empty list"),
        ({"command": "python", "tools": ["add", "add"]}, "a tool is listed twice"),
        ({"command": "python", "startup_timeout": 0}, "greater than 0"),
        ({"command": "python", "args": "x.py"}, "list"),
        ({"command": "python", "port": 1}, "unknown field 'port'"),
    ],
)
def test_server_fields_are_checked(fields, message):
    with pytest.raises(SpecError, match="E_FIELD") as caught:
        server(**fields)
    assert message in str(caught.value)
    assert "mcp_servers.shop" in str(caught.value)  # the refusal names the field


@pytest.mark.parametrize("url", ["http://127.0.0.1:8765/mcp", "http://localhost:1/mcp", "http://[::1]:9/mcp",
                                 "https://127.0.0.2/mcp"])
def test_loopback_urls_are_accepted(url):
    spec = server(url=url).spec().mcp_servers["shop"]
    assert (spec.transport, spec.runs_code) == ("http", False)


def test_a_command_server_is_stdio_and_runs_code():
    spec = McpServerSpec(command="python", args=["server.py"], env={"DB": "x"}, tools=["add"])
    assert (spec.transport, spec.runs_code, spec.startup_timeout) == ("stdio", True, 60.0)


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        (["mcp:bad name"], "does not name an MCP server"),
        (["mcp:"], "does not name an MCP server"),
        (["mcp:shop", "mcp:shop"], "a tool is listed twice"),
    ],
)
def test_agent_mcp_references_are_checked(tools, message):
    with pytest.raises(SpecError, match="E_FIELD") as caught:
        Graph("g").model("base").agent("a", model="base", tools=tools)
    assert message in str(caught.value) and "agents[0].tools" in str(caught.value)


def test_mcp_references_sit_beside_python_tools():
    agent = AgentSpec(name="a", model="m", tools=["shop_tools:lookup_order", "mcp:shop", "mcp:calc"],
                      max_tool_calls=3)
    assert [mcp_server_name(reference) for reference in agent.tools] == [None, "shop", "calc"]
    assert uses_mcp(agent) and not uses_mcp(AgentSpec(name="b", model="m", tools=["shop_tools:lookup_order"]))


def graph(servers: dict, tools=("mcp:shop",)) -> Graph:
    built = Graph("g").input("question")
    built.model("base")
    for name, fields in servers.items():
        built.mcp_server(name, **fields)
    built.agent("support", model="base", tools=list(tools))
    built.node("support", agent="support", prompt="{question}", output=True)
    return built


def test_an_undeclared_server_is_an_unknown_reference():
    with pytest.raises(PlanError, match="E_UNKNOWN_REF") as caught:
        graph({"calc": {"command": "python"}}).validate(trust_code=True)
    assert "tool 'mcp:shop' names no MCP server declared under mcp_servers" in str(caught.value)
    assert "known: calc" in str(caught.value) and "agents[0].tools[0]" in str(caught.value)


def test_a_command_server_needs_trust_code_and_a_url_server_does_not():
    with pytest.raises(PlanError, match="E_TRUST_CODE") as caught:
        graph({"shop": {"command": "python", "args": ["shop.py"]}}).validate()
    assert "MCP server 'shop' runs the command 'python'" in str(caught.value)
    graph({"shop": {"command": "python"}}).validate(trust_code=True)
    graph({"shop": {"url": "http://127.0.0.1:8765/mcp"}}).validate()  # reaches a server; runs nothing
    with pytest.raises(PlanError, match="E_TRUST_CODE"):  # a Python tool beside it still needs trust
        graph({"shop": {"url": "http://127.0.0.1:8765/mcp"}}, tools=("mcp:shop", "shop_tools:lookup_order")).validate()


def test_servers_are_opened_only_for_plans_that_use_them():
    plan = graph({"shop": {"url": "http://127.0.0.1:8765/mcp"}}).plan({"question": "q"})
    assert isinstance(servers_for(plan), McpServers)
    unused = Graph("g").input("question").model("base").mcp_server("shop", url="http://127.0.0.1:1/mcp")
    unused.agent("plain", model="base").node("n", agent="plain", prompt="{question}", output=True)
    assert servers_for(unused.plan({"question": "q"})) is None


YAML = """\
version: 1
name: mcp
inputs: {question: str}
models: [{name: base}]
mcp_servers:
  shop:
    command: python
    args: [server.py]
    env: {SHOP_DB: shop.sqlite}
    tools: [lookup_order]
    startup_timeout: 20
  remote:
    url: http://127.0.0.1:8765/mcp
agents:
  - name: support
    model: base
    tools: [mcp:shop, mcp:remote]
nodes:
  - {name: support, agent: support, prompt: "{question}", output: true}
"""


def test_yaml_declares_servers_and_round_trips_through_the_builder():
    spec = load_graph_text(YAML)
    shop, remote = spec.mcp_servers["shop"], spec.mcp_servers["remote"]
    assert (shop.command, shop.args, shop.env, shop.tools, shop.startup_timeout) == (
        "python", ["server.py"], {"SHOP_DB": "shop.sqlite"}, ["lookup_order"], 20.0)
    assert remote.url == "http://127.0.0.1:8765/mcp" and remote.transport == "http"
    again = Graph.from_spec(spec).to_yaml()
    assert load_graph_text(again) == spec
    assert yaml.safe_load(again)["mcp_servers"]["remote"] == {"url": "http://127.0.0.1:8765/mcp"}


def test_a_bad_server_in_yaml_is_refused_at_its_line():
    text = YAML.replace("url: http://127.0.0.1:8765/mcp", "url: http://example.org/mcp")
    with pytest.raises(SpecError, match="E_FIELD") as caught:
        load_graph_text(text, file="mcp.yaml")
    problem = caught.value.problems[0]
    assert problem.path == ("mcp_servers", "remote", "url")
    assert problem.location is not None and problem.location.line == 13


def test_a_server_name_must_be_a_name_and_declared_once():
    with pytest.raises(SpecError, match="E_FIELD"):
        Graph("g").mcp_server("bad name", command="python")
    with pytest.raises(SpecError, match="E_DUPLICATE_NAME"):
        Graph("g").mcp_server("shop", command="python").mcp_server("shop", command="python")


def test_the_json_schema_describes_servers():
    schema = json_schema()
    assert "mcp_servers" in schema["properties"]
    fields = schema["$defs"]["McpServerSpec"]["properties"]
    assert {"command", "args", "env", "cwd", "url", "tools", "startup_timeout"} <= set(fields)


# -- how a server's results read to the model (executors/mcp_servers.py) -------------------------


def render(*blocks, structured=None):
    # private on purpose: the MCP content conversion under test
    from rclc_graph.executors.mcp_servers import _content_value
    from rclc_graph.executors.tools import result_text

    types = pytest.importorskip("mcp_types")  # the `mcp` extra; `make test` installs it
    content = [types.TextContent(type="text", text=block) if isinstance(block, str) else block for block in blocks]
    return result_text(_content_value(types.CallToolResult(content=content, structured_content=structured)))


def test_json_results_read_as_a_python_tool_s_value_would():
    assert render('{\n  "owner": "Alice",\n  "city": "Oslo"\n}') == '{"city": "Oslo", "owner": "Alice"}'
    assert render('{"id": "A-1"}', '{"id": "A-2"}') == '[{"id": "A-1"}, {"id": "A-2"}]'  # a list, one block per item
    assert render("5") == "5"


def test_other_results_read_as_text_and_named_blocks():
    types = pytest.importorskip("mcp_types")
    assert render("Alice owns it.", "Since 2020.") == "Alice owns it.\nSince 2020."
    image = types.ImageContent(type="image", data="AAAA", mime_type="image/png")
    assert render("a chart:", image) == "a chart:\n[image image/png]"
    assert render(structured={"total": 3}) == '{"total": 3}'  # structured content alone
