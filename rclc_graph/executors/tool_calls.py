"""Finding tool calls in what a model generated, in the forms model families write them.

Families are trained on different call formats, and small models drift between them, so
every turn is read for all of these, tagged forms first:

    hermes   (Qwen2/Qwen3, SmolLM2, Hermes)  <tool_call>{"name": ..., "arguments": {...}}</tool_call>
                                              (several blocks, or a JSON list inside one)
    mistral                                  [TOOL_CALLS] [{"name": ..., "arguments": {...}}]
    llama    (Llama 3.1+)                     <|python_tag|>{"name": ..., "parameters": {...}}
    json     (any family; the plain-text      {"name": ..., "arguments": {...}} as the turn's JSON,
              tool description asks for it)   bare or in a ```json fence

A tagged call is a call even when it is broken: a tool name we do not know or JSON that
does not parse becomes a `ToolCall` with `problem` set, which the tool loop answers with an
error result (so the model can correct itself) instead of ignoring it. A bare JSON object
counts only when its `name` is one of the agent's tools, so an answer that merely contains
JSON is not mistaken for a call. `arguments` may be an object or a JSON string of one (the
OpenAI wire form). JSON values are read with `json.JSONDecoder.raw_decode`, which finds the
end of a value itself, so braces inside strings cannot confuse the scan. Values nested deeper
than MAX_DEPTH (64) levels are no calls; text nested past the interpreter's recursion limit
is skipped in one step, never rescanned bracket by bracket.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Collection

from ..errors import JSONLimitError
from ..spec import bounded_json
from ..spec.safe_yaml import MAX_DEPTH

_DECODER = json.JSONDecoder()
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_MISTRAL = "[TOOL_CALLS]"
_PYTHON_TAG = "<|python_tag|>"
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)

FORMATS = ("hermes", "mistral", "llama", "json")
"""The call forms `parse_tool_calls` reads, in the order it tries them."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: the tool's name and its arguments, or why it cannot run."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # set when the call is malformed or names no known tool
    form: str = "json"  # which of FORMATS it was written in


def parse_tool_calls(text: str, known: Collection[str]) -> list[ToolCall]:
    """The tool calls in one generated turn (empty when the turn is an answer)."""
    known = set(known)
    if "<tool_call>" in text:
        calls: list[ToolCall] = []
        for block in _HERMES.findall(text):
            calls.extend(_tagged(block, known, "hermes"))
        return calls
    if _MISTRAL in text:
        return _tagged(text.split(_MISTRAL, 1)[1], known, "mistral")
    if _PYTHON_TAG in text:
        return _tagged(text.split(_PYTHON_TAG, 1)[1], known, "llama")
    return _bare(text, known)


def _tagged(body: str, known: set[str], form: str) -> list[ToolCall]:
    """Calls inside a tag: one JSON object, several, or a list of them; broken ones included."""
    values = _json_values(body)
    if not values:
        snippet = body.strip()[:80]
        return [ToolCall("", problem=f"the tool call is not JSON: {snippet!r}", form=form)]
    calls = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            calls.append(_call(item, known, form, strict=True))
    return [call for call in calls if call is not None]


def _bare(text: str, known: set[str]) -> list[ToolCall]:
    """A turn whose JSON (bare or fenced) is a call of a known tool."""
    fenced = _FENCE.findall(text)
    for candidate in (fenced or [text]):
        for value in _json_values(candidate):
            items = value if isinstance(value, list) else [value]
            calls = [_call(item, known, "json", strict=False) for item in items]
            found = [call for call in calls if call is not None]
            if found:
                return found
    return []


def _json_values(text: str) -> list[Any]:
    """Every top-level JSON object or list in `text`, left to right."""
    values: list[Any] = []
    index = 0
    while True:
        starts = [position for position in (text.find("{", index), text.find("[", index)) if position >= 0]
        if not starts:
            return values
        start = min(starts)
        try:
            value, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            index = start + 1
            continue
        except RecursionError:  # nested past the interpreter's limit (100k brackets): no call, and
            index = _past_openers(text, start)  # the brackets inside it need no second look
            continue
        if isinstance(value, (dict, list)) and bounded_json.depth(value) <= MAX_DEPTH:
            values.append(value)
        index = end


def _past_openers(text: str, start: int) -> int:
    """The first position after the run of `{`, `[` and white space that begins at `start`."""
    index = start
    while index < len(text) and (text[index] in "{[" or text[index].isspace()):
        index += 1
    return index


def _call(item: Any, known: set[str], form: str, *, strict: bool) -> ToolCall | None:
    """A ToolCall from one decoded object; None when a bare object is no call of ours."""
    if not isinstance(item, dict):
        return ToolCall("", problem="a tool call must be a JSON object with name and arguments", form=form) if strict else None
    function = item.get("function")
    if isinstance(function, dict) and "name" in function:  # {"type": "function", "function": {...}}
        item = function
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", problem="the tool call has no name", form=form) if strict else None
    if name not in known:
        if not strict:
            return None
        return ToolCall(name, problem=f"unknown tool {name!r}; the tools are: {', '.join(sorted(known))}", form=form)
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = bounded_json.loads(arguments) if arguments.strip() else {}
        except JSONLimitError:
            return ToolCall(name, problem=f"its arguments are nested deeper than {MAX_DEPTH} levels (or repeat a key)",
                            form=form)
        except ValueError:
            return ToolCall(name, problem=f"its arguments are not JSON: {arguments[:80]!r}", form=form)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCall(name, problem="its arguments must be a JSON object of parameter: value", form=form)
    return ToolCall(name, arguments, form=form)
