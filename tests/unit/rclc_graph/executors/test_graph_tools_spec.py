"""Tool-calling agents without a model: the fields, whole-graph checks, the builder's callables,
preflight's import-and-describe check, call parsing per family, rendering the tool turn, and
the shipped SQLite example's database and tools."""

from __future__ import annotations

import json
import sqlite3
import sys
from contextlib import closing

import pytest

from rclc import testing
from rclc_graph import Graph, PlanError, SpecError, load_graph_text, plan_file
from rclc_graph.executors.tool_calls import parse_tool_calls
from rclc_graph.executors.tools import describe_tools, load_toolbox, result_text, tool_prompt, tool_turn
from rclc_graph.run.preflight import check_code
from rclc_graph.spec.models import AgentSpec
from tests.helpers import tools
from tests.helpers.tools import LLAMA_TEMPLATE, QWEN_TEMPLATE
from tests.paths import ROOT

KNOWN = ("project_owner", "lookup_order")


# -- fields and whole-graph checks --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tools": ["nocolon"]}, "is not a package.module:callable reference"),
        ({"tools": ["a:f", "a:f"]}, "a tool is listed twice"),
        ({"tools": ["a:f", "b:f"]}, "two tools share a function name"),
        ({"max_tool_calls": 3}, "max_tool_calls set without tools"),
        ({"tool_timeout": 3.0}, "tool_timeout set without tools"),
        ({"tools": ["a:f"], "max_tool_calls": 0}, "greater than 0"),
        ({"tools": ["a:f"], "max_tool_calls": 33}, "less than or equal to 32"),
        ({"tools": ["a:f"], "tool_timeout": -1.0}, "greater than 0"),
        ({"tools": "a:f"}, "list"),
    ],
)
def test_agent_tool_fields_are_checked(fields, message):
    with pytest.raises(SpecError, match="E_FIELD") as caught:
        Graph("g").model("base").agent("a", model="base", **fields)
    assert message in str(caught.value)


YAML = """\
version: 1
name: tools
inputs: {question: str}
models: [{name: base}]
agents:
  - name: support
    model: base
    tools: [tests.helpers.tools:project_owner]
nodes:
  - {name: support, agent: support, prompt: "{question}", generate: false}
  - {name: final, agent: support, prompt: "{question}", output: true}
edges:
  - {source: support, target: final}
"""


def test_tools_need_trust_code_and_generation_with_located_fixes(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(YAML)
    with pytest.raises(PlanError) as caught:
        plan_file(path, {"question": "q"})
    problems = {problem.code: problem for problem in caught.value.problems}
    assert set(problems) == {"E_TRUST_CODE", "E_TOOLS"}
    assert problems["E_TRUST_CODE"].location.line == 8 and "--trust-code" in problems["E_TRUST_CODE"].fix
    assert problems["E_TOOLS"].location.line == 10 and "generate: true" in problems["E_TOOLS"].fix
    path.write_text(YAML.replace(", generate: false", ""))
    plan = plan_file(path, {"question": "q"}, trust_code=True)
    assert plan.node("support").agent.tools == ("tests.helpers.tools:project_owner",) or \
        list(plan.node("support").agent.tools) == ["tests.helpers.tools:project_owner"]


def test_tools_round_trip_through_yaml_and_the_schema():
    spec = load_graph_text(YAML.replace(", generate: false", "").replace("model: base\n    tools",
                           "model: base\n    max_tool_calls: 3\n    tool_timeout: 2.5\n    tools"))
    again = load_graph_text(Graph.from_spec(spec).to_yaml())
    assert again == spec and again.agents[0].max_tool_calls == 3
    from rclc_graph import json_schema

    properties = json_schema()["$defs"]["AgentSpec"]["properties"]
    assert {"tools", "max_tool_calls", "tool_timeout"} <= set(properties)
    assert properties["max_tool_calls"]["maximum"] == 32
    model = json_schema()["$defs"]["ModelSpec"]["properties"]
    assert {"base_url", "model", "api_key_env", "timeout", "max_retries"} <= set(model)
    assert "openai" in model["backend"]["enum"]


def test_the_builder_takes_functions_and_names_them_by_import():
    graph = Graph("g").model("base")
    graph.agent("a", model="base", tools=[tools.project_owner, "tests.helpers.tools:slow_lookup"])
    assert graph.spec().agents[0].tools == ["tests.helpers.tools:project_owner", "tests.helpers.tools:slow_lookup"]
    for bad in (lambda project: project, _nested()):
        with pytest.raises(SpecError, match="E_FIELD") as caught:
            Graph("g").model("base").agent("a", model="base", tools=[bad])
        assert "top level of a module" in caught.value.fix and caught.value.path == ("agents", 0, "tools", 0)


def _nested():
    def inner(project: str) -> str:
        """Inner.

        Args:
            project: a name.
        """
        return project

    return inner


def test_a_main_module_function_is_refused(monkeypatch):
    module = type(sys)("__main__")

    def tool(project: str) -> str:
        return project

    tool.__module__ = "__main__"
    tool.__qualname__ = "tool"
    module.tool = tool
    monkeypatch.setitem(sys.modules, "__main__", module)
    with pytest.raises(SpecError, match="cannot be named by import"):
        Graph("g").model("base").agent("a", model="base", tools=[tool])


def test_preflight_refuses_tools_that_do_not_import_or_cannot_be_described():
    graph = Graph("g").input("q").model("base")
    graph.agent("a", model="base", tools=["tests.helpers.tools:nosuch"])
    graph.agent("b", model="base", tools=["tests.helpers.tools:undocumented"])
    graph.node("a", agent="a", prompt="{q}").node("b", agent="b", prompt="{q}", output=True)
    graph.edge("a", "b")
    with pytest.raises(PlanError) as caught:
        check_code(graph.plan({"q": "x"}, trust_code=True))
    first, second = caught.value.problems
    assert first.code == second.code == "E_UNKNOWN_REF"
    assert "has no attribute 'nosuch'" in first.message and first.path == ("agents", 0, "tools")
    assert "cannot be described" in second.message and "docstring" in second.fix


def test_a_toolbox_holds_names_schemas_and_functions():
    box = load_toolbox(AgentSpec(name="a", model="m", tools=["tests.helpers.tools:project_owner"]), trust_code=True)
    assert box.names == ("project_owner",)
    [schema] = box.schemas
    assert schema["function"]["parameters"]["required"] == ["project"]
    assert "return" not in schema["function"]
    text = describe_tools(box.schemas)
    assert "project_owner(project: string): Who owns a project" in text and '"arguments"' in text
    with pytest.raises(PlanError, match="E_TRUST_CODE"):
        load_toolbox(AgentSpec(name="a", model="m", tools=["tests.helpers.tools:project_owner"]), trust_code=False)


# -- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>\n{"name": "project_owner", "arguments": {"project": "Cedar"}}\n</tool_call>',
         [("project_owner", {"project": "Cedar"}, None, "hermes")]),
        ('<tool_call>[{"name": "project_owner", "arguments": {"project": "A"}}, '
         '{"name": "lookup_order", "arguments": {"order_id": "A-1"}}]</tool_call>',
         [("project_owner", {"project": "A"}, None, "hermes"), ("lookup_order", {"order_id": "A-1"}, None, "hermes")]),
        ('Sure.<tool_call>{"name": "project_owner", "arguments": {"project": "A"}}</tool_call>'
         '<tool_call>{"name": "project_owner", "arguments": {"project": "B"}}',  # the second never closed
         [("project_owner", {"project": "A"}, None, "hermes"), ("project_owner", {"project": "B"}, None, "hermes")]),
        ('[TOOL_CALLS] [{"name": "lookup_order", "arguments": {"order_id": "A-7"}}]',
         [("lookup_order", {"order_id": "A-7"}, None, "mistral")]),
        ('<|python_tag|>{"name": "lookup_order", "parameters": {"order_id": "A-7"}}',
         [("lookup_order", {"order_id": "A-7"}, None, "llama")]),
        ('{"name": "project_owner", "parameters": {"project": "Cedar"}}',
         [("project_owner", {"project": "Cedar"}, None, "json")]),
        ('Let me check.\n```json\n{"name": "project_owner", "arguments": "{\\"project\\": \\"Cedar\\"}"}\n```',
         [("project_owner", {"project": "Cedar"}, None, "json")]),
        ('{"type": "function", "function": {"name": "lookup_order", "arguments": {"order_id": "A-2"}}}',
         [("lookup_order", {"order_id": "A-2"}, None, "json")]),
        ('{"name": "weather", "arguments": {"city": "Oslo"}}', []),  # bare JSON naming no tool of ours
        ('The answer is {"owner": "Alice"} as JSON.', []),
        ("Cedar is owned by Alice.", []),
        ('The brace } in "a string {" is text.', []),
        ('<tool_call>{"name": "weather", "arguments": {}}</tool_call>',
         [("weather", {}, "unknown tool 'weather'; the tools are: lookup_order, project_owner", "hermes")]),
        ("<tool_call>project_owner(Cedar)</tool_call>",
         [("", {}, "the tool call is not JSON: 'project_owner(Cedar)'", "hermes")]),
        ('<tool_call>{"name": "project_owner", "arguments": "{bad"}</tool_call>',
         [("project_owner", {}, "its arguments are not JSON: '{bad'", "hermes")]),
        ('<tool_call>{"name": "project_owner", "arguments": [1]}</tool_call>',
         [("project_owner", {}, "its arguments must be a JSON object of parameter: value", "hermes")]),
    ],
)
def test_calls_are_read_in_every_family_format(text, expected):
    calls = parse_tool_calls(text, KNOWN)
    assert [(call.name, call.arguments, call.problem, call.form) for call in calls] == expected


def test_results_are_text_or_json_and_long_ones_are_cut():
    assert result_text("plain") == "plain"
    assert result_text({"b": 1, "a": [1, 2]}) == '{"a": [1, 2], "b": 1}'
    long = result_text("x" * 5000)
    assert len(long) < 4100 and long.endswith("(cut at 4000 characters)")


# -- rendering --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def box():
    return load_toolbox(AgentSpec(name="a", model="m", tools=["tests.helpers.tools:project_owner"]), trust_code=True)


def _tokenizer(template):
    tokenizer = testing.tiny_tokenizer()
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def test_a_tool_template_describes_tools_natively_and_renders_results_as_its_tool_turn(box):
    tokenizer = _tokenizer(QWEN_TEMPLATE)
    prompt, conversation = tool_prompt(tokenizer, "Be brief.", "Who owns Cedar?", box)
    assert "<tools>" in prompt and '"name": "project_owner"' in prompt and "Be brief." in prompt
    assert prompt.endswith("<|im_start|>assistant\n") and conversation.tools is not None
    turn = tool_turn(conversation, 1, [("project_owner", '{"owner": "Alice"}')], "<|im_end|>")
    assert turn == '\n<|im_start|>user\n<tool_response>\n{"owner": "Alice"}\n</tool_response><|im_end|>\n' \
                   "<|im_start|>assistant\n"
    # Without the end token (generation hit max_new_tokens) the assistant turn is closed first.
    assert tool_turn(conversation, 1, [("project_owner", "x")], None).startswith("<|im_end|>\n<|im_start|>user")
    two = tool_turn(conversation, 1, [("project_owner", "A"), ("project_owner", "B")], "<|im_end|>")
    assert two.count("<tool_response>") == 2 and two.count("<|im_start|>user") == 1


def test_a_llama_style_template_puts_tools_in_the_user_turn(box):
    tokenizer = _tokenizer(LLAMA_TEMPLATE)
    prompt, conversation = tool_prompt(tokenizer, "", "Who owns Cedar?", box)
    assert '"parameters"' in prompt and prompt.index("project_owner") < prompt.index("Who owns Cedar?")
    turn = tool_turn(conversation, 1, [("project_owner", "Alice")], "<|im_end|>")
    assert turn == "\n<|im_start|>ipython\nAlice<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_without_tools_falls_back_to_a_described_system_prompt(box):
    tokenizer = _tokenizer(None)  # the tiny ChatML template, which ignores `tools` like SmolLM2's
    prompt, conversation = tool_prompt(tokenizer, "Be brief.", "Who owns Cedar?", box)
    assert conversation.tools is None
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools:\n- project_owner(")
    turn = tool_turn(conversation, 1, [("project_owner", "Alice")], "<|im_end|>")
    assert turn == "\n<|im_start|>tool\nAlice<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_refuses_tool_messages_gets_the_results_as_a_user_turn(box):
    strict = ("{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
              "{{ raise_exception('unknown role') }}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    prompt, conversation = tool_prompt(_tokenizer(strict), "", "Who owns Cedar?", box)
    turn = tool_turn(conversation, 1, [("project_owner", "Alice")], "<|im_end|>")
    assert turn == "\n<|im_start|>user\nResult of project_owner: Alice<|im_end|>\n<|im_start|>assistant\n"


# -- the shipped example ------------------------------------------------------------------------


def test_the_shipped_database_is_what_the_script_builds(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import build_shop_db
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    rebuilt = build_shop_db.build(tmp_path / "shop.sqlite")

    def rows(path):
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
            return list(connection.iterdump())

    assert rows(ROOT / "examples" / "shop.sqlite") == rows(rebuilt)
    assert (ROOT / "examples" / "shop.sqlite").stat().st_mode & 0o044  # readable by others


def test_the_example_tools_query_the_database(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import shop_tools

    order = shop_tools.lookup_order(" a-1002 ")
    assert order == {"id": "A-1002", "customer": "Jonas Berg", "placed_on": "2026-11-10", "status": "shipped",
                     "carrier": "PostNord", "expected_delivery": "2026-11-21", "items": ["1 x office chair"],
                     "total": "189.00 EUR"}
    assert [row["id"] for row in shop_tools.orders_of_customer("jonas")] == ["A-1007", "A-1002"]
    with pytest.raises(LookupError, match="no order 'A-9999'"):
        shop_tools.lookup_order("A-9999")
    with pytest.raises(sqlite3.OperationalError):  # opened read-only: a tool cannot change the shop
        with closing(shop_tools._connect()) as connection:
            connection.execute("DELETE FROM orders")
    plan = plan_file(ROOT / "topologies" / "tool_agent.yaml",
                     json.loads((ROOT / "examples" / "inputs" / "tool_agent.json").read_text()), trust_code=True)
    check_code(plan)  # both tools import and can be described


# issue 24 item 8: orders_of_customer("%"), ("") and ("_") returned every customer's orders
# (LIKE wildcards were not escaped); on the real examples/shop.sqlite
@pytest.mark.parametrize("name", ["%", "_", "", "   ", "%%%", "___", "a%", "%_%", "\\%"])
def test_the_customer_tool_never_lists_every_customer(monkeypatch, name):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import shop_tools

    with pytest.raises(LookupError):
        shop_tools.orders_of_customer(name)


# issue 24 item 8: a real part of a name still finds its customer's orders, and only theirs
def test_the_customer_tool_matches_parts_of_names_literally(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import shop_tools

    with closing(shop_tools._connect()) as connection:
        every = {row[0] for row in connection.execute("SELECT id FROM orders")}
    found = {row["id"] for row in shop_tools.orders_of_customer("Berg")}
    assert found == {"A-1007", "A-1002"} and found < every
