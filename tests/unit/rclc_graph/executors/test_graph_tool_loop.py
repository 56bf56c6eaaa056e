"""Tool-calling agents on tiny Qwen3 and Llama models whose output is scripted by a hook.

The model is made to write a call in its family's format; the node must parse it, run the
tool in a worker, append the result as the template's tool turn through `Agent.append`, and
generate the answer from the state it holds (nothing prefilled again), within
`max_tool_calls`. Failing tools become error results. Lineage, events, records and the
report show the calls; a state edge out of a tool agent carries `tool` positions.
"""

from __future__ import annotations

import json

import pytest
import torch

from rclc_graph import Graph, LocalExecutor, ModelPool, Policy, run_recorded_sync
from rclc_graph.run.scheduler import run_plan, run_plan_sync
from rclc_graph.spec.models import ModelSpec
from tests.helpers.event_runs import run_consumed
from tests.helpers.tools import call_text, family_tokenizer, scripted

ANSWER = "Cedar is owned by Alice."


def family_of(model) -> str:
    return "qwen3" if model.config.model_type == "qwen3" else "llama"


def pool_for(model, tokenizer) -> ModelPool:
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    return pool


def tool_graph(*, tools=("tests.helpers.tools:project_owner",), max_tool_calls=2, tool_timeout=5.0, receiver=False,
               constrain_tools=True):
    graph = Graph("tools").input("question")
    graph.model("base")
    graph.agent("support", model="base", system="You answer with tools.", tools=list(tools),
                max_tool_calls=max_tool_calls, tool_timeout=tool_timeout, max_new_tokens=96,
                constrain_tools=constrain_tools)
    graph.node("support", agent="support", prompt="{question}", output=not receiver)
    if receiver:
        graph.agent("writer", model="base", max_new_tokens=4)
        graph.node("reply", agent="writer", prompt="Reply: {question}", output=True)
        graph.edge("support", "reply", Policy(mode="state", budget=48, request="{question}"))
    return graph.plan({"question": "Who owns Cedar?"}, trust_code=True)


def run_with_events(plan, pool):
    return run_consumed(lambda events: run_plan(plan, pool=pool, events=events))


def test_a_call_in_the_family_format_runs_the_tool_and_the_answer_follows(tiny):
    model, base_tokenizer = tiny
    family = family_of(model)
    tokenizer = family_tokenizer(base_tokenizer, family)
    pool = pool_for(model, tokenizer)
    executor = LocalExecutor(pool)
    call = call_text(family, "project_owner", {"project": "Cedar"})
    with scripted(model, tokenizer, [call, ANSWER]) as left:
        result = run_plan_sync(tool_graph(), executor=executor, run_id="r1")
    assert result.status == "finished", result.error
    assert not left
    node = result.nodes["support"]
    assert node.text == ANSWER
    [made] = node.tool_calls
    assert (made["name"], made["arguments"], made["error"]) == ("project_owner", {"project": "Cedar"}, None)
    assert json.loads(made["result"]) == {"owner": "Alice", "city": "Oslo"}
    assert made["call_id"] == "support#1"
    # The prompt described the tools in the template's own format.
    assert ("<tools>" if family == "qwen3" else '"parameters"') in node.prompt_text
    # Lineage: prompt, the call's tokens, the tool turn, the answer's tokens; nothing else.
    kinds = [(segment.kind, segment.length) for segment in node.lineage.segments]
    assert [kind for kind, _ in kinds] == ["prompt", "token", "tool", "token"]
    assert sum(length for _, length in kinds) == node.positions == len(node.lineage)
    assert node.generated_tokens == kinds[1][1] + kinds[3][1]
    # The agent's state is exactly prompt + call + rendered tool turn + answer.
    state = executor.agent("r1", "support").sender_state()
    text = tokenizer.decode(state.token_ids.tolist(), skip_special_tokens=False)
    assert text.startswith(node.prompt_text) and text.endswith(ANSWER + tokenizer.eos_token)
    tool_turn = tokenizer.decode(state.token_ids[kinds[0][1] + kinds[1][1]: -kinds[3][1]].tolist())
    assert made["result"] in tool_turn
    if family == "qwen3":
        assert "<tool_response>" in tool_turn
    else:
        assert "ipython" in tool_turn


def test_tool_events_come_between_the_turns_with_the_contract_payloads(tiny_qwen3):
    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, "qwen3")
    call = call_text("qwen3", "project_owner", {"project": "Birch"})
    with scripted(model, tokenizer, [call, ANSWER]):
        result, events = run_with_events(tool_graph(), pool_for(model, tokenizer))
    assert result.status == "finished", result.error
    tool_events = [event.payload for event in events if event.kind == "tool"]
    assert tool_events == [
        {"node": "support", "phase": "call", "call_id": "support#1", "name": "project_owner",
         "arguments": {"project": "Birch"}},
        {"node": "support", "phase": "result", "call_id": "support#1", "name": "project_owner",
         "result": json.dumps({"city": "Lima", "owner": "Bob"}), "error": None},
    ]
    tokens = [event.payload["index"] for event in events if event.kind == "token"]
    assert tokens == list(range(len(tokens))) and len(tokens) == result.nodes["support"].generated_tokens
    kinds = [event.kind for event in events]
    assert kinds.index("tool") > kinds.index("token")  # the call was generated before it ran


@pytest.mark.parametrize(
    ("tool", "arguments", "error"),
    [
        ("project_owner", {"project": "Oak"}, "LookupError: no project 'Oak'"),
        ("project_owner", {"name": "Cedar"}, "bad arguments for project_owner"),
        ("delete_everything", {}, "unknown tool 'delete_everything'"),
        ("slow_lookup", {"project": "Cedar"}, "TimeoutError: slow_lookup took longer than 0.3 s"),
    ],
)
def test_a_failing_call_becomes_an_error_result_and_the_node_answers(tiny_qwen3, tool, arguments, error):
    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, "qwen3")
    # unconstrained: the grammar would not let the model write a bad call (test_graph_constrained_tools.py)
    # the short timeout only where a timeout is meant: a loaded machine's slow thread start must
    # not turn another row's expected error into a timeout
    plan = tool_graph(tools=("tests.helpers.tools:project_owner", "tests.helpers.tools:slow_lookup"),
                      tool_timeout=0.3 if tool == "slow_lookup" else 30.0, constrain_tools=False)
    with scripted(model, tokenizer, [call_text("qwen3", tool, arguments), ANSWER]):
        result = run_plan_sync(plan, pool=pool_for(model, tokenizer))
    assert result.status == "finished", result.error
    [made] = result.nodes["support"].tool_calls
    assert made["error"].startswith(error) and made["result"] == f"error: {made['error']}"
    assert result.nodes["support"].text == ANSWER


def test_async_tools_are_awaited(tiny_qwen3):
    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, "qwen3")
    plan = tool_graph(tools=("tests.helpers.tools:async_owner",))
    with scripted(model, tokenizer, [call_text("qwen3", "async_owner", {"project": "Cedar"}), ANSWER]):
        result = run_plan_sync(plan, pool=pool_for(model, tokenizer))
    assert result.nodes["support"].tool_calls[0]["result"] == "Alice"


def test_the_loop_stops_after_max_tool_calls(tiny_qwen3):
    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, "qwen3")
    calls = [call_text("qwen3", "project_owner", {"project": name}) for name in ("Cedar", "Birch", "Cedar")]
    with scripted(model, tokenizer, calls + [ANSWER]) as left:  # unconstrained: the grammar would allow no third call
        result = run_plan_sync(tool_graph(max_tool_calls=2, constrain_tools=False), pool=pool_for(model, tokenizer))
    node = result.nodes["support"]
    assert [call["arguments"]["project"] for call in node.tool_calls] == ["Cedar", "Birch"]
    assert "<tool_call>" in calls[2] and node.text == tokenizer.decode(
        tokenizer(calls[2], add_special_tokens=False)["input_ids"], skip_special_tokens=True).strip()
    assert left  # the answer was never asked for
    assert [segment.kind for segment in node.lineage.segments] == ["prompt", "token", "tool", "token", "tool", "token"]


def test_several_calls_in_one_turn_run_in_order_and_return_together(tiny_qwen3):
    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, "qwen3")
    turn = call_text("qwen3", "project_owner", {"project": "Cedar"}) + call_text("qwen3", "project_owner", {"project": "Birch"})
    with scripted(model, tokenizer, [turn, ANSWER]):
        result = run_plan_sync(tool_graph(max_tool_calls=4), pool=pool_for(model, tokenizer))
    node = result.nodes["support"]
    assert [call["call_id"] for call in node.tool_calls] == ["support#1", "support#2"]
    assert [segment.kind for segment in node.lineage.segments] == ["prompt", "token", "tool", "token"]


def test_a_template_without_tools_gets_the_plain_text_description(tiny_qwen3):
    model, tokenizer = tiny_qwen3  # the tiny ChatML template ignores `tools`, as SmolLM2's does
    call = json.dumps({"name": "project_owner", "arguments": {"project": "Cedar"}})
    with scripted(model, tokenizer, [call, ANSWER]):
        result = run_plan_sync(tool_graph(), pool=pool_for(model, tokenizer))
    node = result.nodes["support"]
    assert "You can call these tools:" in node.prompt_text and "project_owner(project: string)" in node.prompt_text
    assert node.tool_calls[0]["form"] == "json" and node.text == ANSWER
    # The result came back as a `tool` turn of the ChatML template.
    assert [segment.kind for segment in node.lineage.segments] == ["prompt", "token", "tool", "token"]


def test_no_call_means_one_generation_and_plain_lineage(tiny_qwen3):
    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, "qwen3")
    with scripted(model, tokenizer, [ANSWER]):
        result = run_plan_sync(tool_graph(), pool=pool_for(model, tokenizer))
    node = result.nodes["support"]
    assert node.tool_calls == [] and node.text == ANSWER
    assert [segment.kind for segment in node.lineage.segments] == ["prompt", "token"]


def test_tool_positions_cross_a_state_edge_with_their_kind(tiny_qwen3):
    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, "qwen3")
    with scripted(model, tokenizer, [call_text("qwen3", "project_owner", {"project": "Cedar"}), ANSWER, "Hi"]):
        result = run_plan_sync(tool_graph(receiver=True), pool=pool_for(model, tokenizer))
    assert result.status == "finished", result.error
    reply = result.nodes["reply"]
    inherited = [segment for segment in reply.lineage.segments if segment.hops == 1]
    assert {segment.node for segment in inherited} == {"support"}
    assert sum(segment.length for segment in inherited) == result.hops[0].kept_positions == 48
    summary = reply.lineage.summary()
    assert set(summary["by_kind"]) <= {"prompt", "token", "tool"}


def test_records_and_the_report_show_calls_and_results(tiny_qwen3, tmp_path):
    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, "qwen3")
    with scripted(model, tokenizer, [call_text("qwen3", "project_owner", {"project": "<b>Cedar</b>"}), ANSWER]):
        result, record, run_dir = run_recorded_sync(tool_graph(), tmp_path, pool=pool_for(model, tokenizer))
    assert result.status == "finished"
    [made] = record["nodes"]["support"]["tool_calls"]
    assert made["name"] == "project_owner" and made["error"].startswith("LookupError")
    node_file = json.loads((run_dir / "nodes" / "support.json").read_text())
    assert node_file["tool_calls"] == record["nodes"]["support"]["tool_calls"]
    page = (run_dir / "report.html").read_text()
    assert "Tool calls" in page and "project_owner" in page and "support#1" in page
    assert "<b>Cedar</b>" not in page and "&lt;b&gt;Cedar&lt;/b&gt;" in page


def test_the_tool_turn_is_appended_not_prefilled_again(tiny_qwen3):
    """After the call, only the tool turn and the answer are forwarded: no pass reads the prompt again."""
    from tests.helpers.agents import counted_forwards, prompts_alone

    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, "qwen3")
    # prompts alone: an earlier test's run of the same prompt would leave its prefix stored (issue 28)
    with scripted(model, tokenizer, [call_text("qwen3", "project_owner", {"project": "Cedar"}), ANSWER]):
        with prompts_alone(model), counted_forwards(model) as calls:
            result = run_plan_sync(tool_graph(), pool=pool_for(model, tokenizer))
    node = result.nodes["support"]
    prompt, first, turn, second = (segment.length for segment in node.lineage.segments)
    assert calls[0] == prompt  # the one prefill of the prompt
    assert turn in calls[1:] and all(count <= turn for count in calls[1:])  # then one token, or the turn, at a time
    assert len(calls) <= first + second + 4  # decode steps of both turns, the append, two recording steps


# issue 24 item 10: parse_tool_calls raised RecursionError on 100k nested brackets
@pytest.mark.parametrize("text", [
    "[" * 100_000, "{" * 100_000, "<tool_call>" + "[" * 100_000 + "</tool_call>",
    '{"name": "lookup", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"name": "lookup", "arguments": "' + "[" * 100_000 + "]" * 100_000 + '"}',
])
def test_deeply_nested_text_is_no_call_and_no_crash(text):
    from rclc_graph.executors.tool_calls import parse_tool_calls

    calls = parse_tool_calls(text, ["lookup"])
    assert all(call.problem for call in calls)  # nothing runs: at most a broken call the model is told about


# issue 24 item 6: a tool call's arguments nested deeper than JSON files may be are a broken call
def test_deep_arguments_are_a_broken_call():
    from rclc_graph.executors.tool_calls import parse_tool_calls

    deep = "[" * 80 + "]" * 80
    (call,) = parse_tool_calls('<tool_call>{"name": "lookup", "arguments": "{\\"a\\": %s}"}</tool_call>' % deep, ["lookup"])
    assert call.problem and "nested deeper than 64 levels" in call.problem
