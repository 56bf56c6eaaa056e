"""The grammar a tool-calling agent's turns are decoded under (constrained tool calls).

Each turn of the tool loop is generated under one format (`rclc.Constraint.format`: the HF
backend runs it as an llguidance grammar, vLLM as an xgrammar structural tag) built from
the agent's tools:

    call | answer      tool_choice: auto; required, once a call returned without an error
    call               tool_choice: required, until a call returned without an error
    answer             the calls are spent (max_tool_calls)
    call:   JSON Schema {anyOf: one object per tool: {"name": const, "arguments": its parameters}}
    answer: text that does not begin like a call   (or the node's output_schema, when it has one)

So a call always names one of the tools and its arguments always match that tool's JSON
schema (types, required parameters, enums, no unknown parameters), and a turn is either a
call or an answer, decided by the model's first token. The call is written in the form the
prompt asked for (`call_form`): inside `<tool_call>...</tool_call>` when the chat template's
own tool format uses those tags (Qwen2/Qwen3, Hermes), `{"name": ..., "parameters": ...}`
when it asks for that (Llama 3.1+), else the bare `{"name": ..., "arguments": ...}` object the
plain-text description asks for (tools.py); tool_calls.py reads all three. JSON is on one
line with `json.dumps`' separators (rclc.Constraint.json_fragment). What the grammar cannot decide is whether the model picks the right tool
or the right argument values: that is the model's (benchmarks/tool_calls.py measures both).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal, Mapping, Sequence

import rclc

from .structured import closed

CallForm = Literal["json", "hermes", "llama"]
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>\n", "\n</tool_call>"
# An answer may not begin like a call: not with "{" (a JSON call), "<" (a tagged one), nor
# white space before either; everything after its first character is free.
_ANSWER_TEXT = r"[^{<\s][\s\S]*"


def call_form(prompt_text: str, native_tools: bool) -> CallForm:
    """How the prompt asked for calls: `hermes` when the template's own tool format wants
    `<tool_call>` tags, `llama` when it wants `{"name": ..., "parameters": ...}` (Llama 3.1+),
    else `json` (`{"name": ..., "arguments": ...}`, what the plain-text description asks for)."""
    if native_tools and "<tool_call>" in prompt_text:
        return "hermes"
    if native_tools and '"parameters"' in prompt_text:
        return "llama"
    return "json"


def call_schema(tool: Mapping[str, Any], key: str = "arguments") -> dict[str, Any]:
    """One tool's call as a JSON Schema: its name as a constant, its parameters' schema under
    `key` (no parameters beyond those it declares)."""
    function = tool["function"]
    parameters = closed(dict(function.get("parameters") or {}))
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    parameters.setdefault("additionalProperties", False)
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, key: parameters},
        "required": ["name", key],
        "additionalProperties": False,
    }


def turn_format(
    tools: Sequence[Mapping[str, Any]],
    *,
    form: CallForm,
    may_call: bool,
    must_call: bool,
    answer_schema: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The format tree of one turn (rclc.Constraint.format; see the module docs)."""
    key = "parameters" if form == "llama" else "arguments"
    call: dict[str, Any] = {"type": "json_schema", "json_schema": {"anyOf": [call_schema(tool, key) for tool in tools]}}
    if form == "hermes":  # one or more tagged calls, as Hermes-style templates allow
        call = {"type": "plus", "content": {"type": "sequence", "elements": [
            {"type": "const_string", "value": _HERMES_OPEN}, call, {"type": "const_string", "value": _HERMES_CLOSE}]}}
    if answer_schema is not None:
        answer: dict[str, Any] = {"type": "json_schema", "json_schema": closed(dict(answer_schema))}
    else:
        answer = {"type": "regex", "pattern": _ANSWER_TEXT}
    if must_call:
        return call
    if may_call:
        return {"type": "or", "elements": [call, answer]}
    return answer


def format_constraint(tree: Mapping[str, Any]) -> Any:
    """A format tree (`turn_format`'s) as an `rclc.Constraint`, compiled once per distinct tree."""
    return _compiled(json.dumps(tree))


@functools.lru_cache(maxsize=64)
def _compiled(tree_text: str) -> Any:
    return rclc.Constraint.format(json.loads(tree_text))
