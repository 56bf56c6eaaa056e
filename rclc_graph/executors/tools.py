"""Tool-calling agents: describe the tools to the model, run the bounded tool loop.

A node whose agent lists `tools` runs this loop instead of one generation:

0. its tools are Python functions (`module:function`, imported with trust_code) and the tools
   of the MCP servers it names (`mcp:<server>`, listed by the server when the run starts it:
   mcp_servers.py); both are called the same way below;
1. its prompt describes the tools in the chat template's own tool format
   (`apply_chat_template(..., tools=schemas)`, schemas from the functions' signatures and
   docstrings by `transformers.utils.get_json_schema`, or as the MCP server lists them). A template that ignores `tools`
   (SmolLM2's renders the same text with or without them) gets a plain-text description
   in the system prompt instead, asking for a JSON call (`describe_tools`);
2. the agent generates (`Agent.generate`), each turn constrained to the tools' signatures
   unless `constrain_tools: false` (tool_grammar.py: a call of one tool with arguments that
   fit it, or an answer; `tool_choice: required` calls until a call returns without an
   error); tool_calls.py reads the turn for calls;
3. each call runs in a worker thread with the agent's `tool_timeout` (a coroutine function
   is awaited on the loop under the same timeout); a tool that raises, times out, gets
   bad arguments or does not exist gives an error *result* naming the problem, never a
   failed node;
4. the results are rendered as the template's tool turn, appended with `Agent.append` (the
   core tokenizes it; nothing is prefilled again), and the agent generates its next turn
   from the state it holds (`Agent.generate(from_state=True)`);
5. at most `max_tool_calls` calls per node; a turn without a call (or any turn once the
   calls are spent) is the node's text.

A timed-out tool's thread cannot be killed: it is abandoned and finishes in the
background (its result is dropped; it runs as a daemon thread, so it never holds up the
process's exit: executors/user_threads.py). Tools should therefore be quick and side-effect free,
or enforce their own deadlines.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

import anyio

import rclc

from ..errors import CallTimedOut, UsageError
from ..spec.models import AgentSpec, mcp_server_name, tool_name
from .mcp_servers import McpServers, McpTool
from .tool_calls import ToolCall, parse_tool_calls
from .tool_grammar import CallForm, call_form, format_constraint, turn_format
from .trusted_code import import_callable
from .user_threads import call_in_own_thread

MAX_RESULT_CHARS = 4000
"""A tool result longer than this is cut (and says so): results share the agent's context."""
_SENTINEL = "\u2063rclc-assistant-turn\u2063"  # stands for an assistant turn's content when rendering

Generate = Callable[..., Awaitable[Any]]
"""`await generate(prompt=None, *, deliveries=0, from_state=False, constraint=None)` -> rclc.GenerationResult."""


@dataclass(frozen=True)
class Toolbox:
    """An agent's tools: name -> callable (a Python function, or an `McpTool` of a running
    server), and the JSON schemas the model is shown (tool order)."""

    functions: dict[str, Callable[..., Any] | McpTool]
    schemas: tuple[dict[str, Any], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.functions)


_toolboxes: dict[tuple[str, ...], Toolbox] = {}
_toolboxes_lock = threading.Lock()


def load_toolbox(agent: AgentSpec, *, trust_code: bool) -> Toolbox:
    """Import and describe the Python functions among `agent.tools` (once per process per list
    of references); the MCP servers it names are `open_toolbox`'s.

    PlanError (E_TRUST_CODE) without trust_code; ValueError naming the tool when it does
    not import, is not callable, or cannot be described (no type hints or docstring).
    """
    key = tuple(reference for reference in agent.tools if mcp_server_name(reference) is None)
    if not key:
        return Toolbox({}, ())
    with _toolboxes_lock:
        known = _toolboxes.get(key)
    if known is not None:
        if not trust_code:  # a cached toolbox must not bypass the trust check
            import_callable(key[0], trust_code=False, field_name="tools")
        return known
    functions: dict[str, Callable[..., Any]] = {}
    schemas = []
    for reference in key:
        function = import_callable(reference, trust_code=trust_code, field_name="tools")
        schemas.append(describe_function(function, reference))
        functions[tool_name(reference)] = function
    box = Toolbox(functions, tuple(schemas))
    with _toolboxes_lock:
        return _toolboxes.setdefault(key, box)


async def open_toolbox(agent: AgentSpec, *, trust_code: bool, servers: McpServers | None) -> Toolbox:
    """Every tool of `agent`, in the order its `tools` list them: its Python functions
    (`load_toolbox`) and the tools of each MCP server it names, started in `servers` if need be.

    UsageError when two tools share a name (the model calls tools by name); ToolServerFailed
    when a server cannot start."""
    python = load_toolbox(agent, trust_code=trust_code)
    functions: dict[str, Callable[..., Any] | McpTool] = {}
    schemas: list[dict[str, Any]] = []
    offered_by: dict[str, str] = {}
    python_schemas = {schema["function"]["name"]: schema for schema in python.schemas}
    for reference in agent.tools:
        server = mcp_server_name(reference)
        if server is None:
            name = tool_name(reference)
            entries = [(name, python.functions[name], python_schemas[name])]
        else:
            if servers is None:
                raise UsageError(f"tools: {reference} needs the run's MCP servers, and none were opened for it")
            entries = [(tool.name, tool, tool.schema) for tool in await servers.tools(server)]
        for name, function, schema in entries:
            if name in offered_by:
                raise UsageError(
                    f"tools: agent {agent.name!r} is offered two tools named {name!r} ({offered_by[name]} and "
                    f"{reference}); the model calls tools by name: give the MCP server a tools: list without it, "
                    "or drop one"
                )
            offered_by[name] = reference
            functions[name] = function
            schemas.append(schema)
    return Toolbox(functions, tuple(schemas))


def describe_function(function: Callable[..., Any], reference: str) -> dict[str, Any]:
    """The tool's JSON schema ({"type": "function", "function": {...}}) from its signature and docstring."""
    from transformers.utils import get_json_schema  # lazy: transformers imports torch

    try:
        schema = get_json_schema(function)
    except Exception as error:  # transformers raises its own parsing exceptions
        raise UsageError(
            f"tools: {reference!r} cannot be described to the model ({error}); give every parameter a type hint and "
            "the function a docstring with an Args: section describing each parameter"
        ) from None
    schema["function"]["name"] = tool_name(reference)
    schema["function"].pop("return", None)
    return schema


def describe_tools(schemas: Sequence[dict[str, Any]]) -> str:
    """The plain-text tool description for templates without a tool format (goes in the system prompt)."""
    lines = ["You can call these tools:"]
    for schema in schemas:
        function = schema["function"]
        parameters = function.get("parameters", {}).get("properties", {})
        required = set(function.get("parameters", {}).get("required", []))
        listed = ", ".join(
            f"{name}: {spec.get('type', 'any')}{'' if name in required else ' (optional)'}"
            for name, spec in parameters.items()
        )
        lines.append(f"- {function['name']}({listed}): {function.get('description', '').strip()}")
        for name, spec in parameters.items():
            if spec.get("description"):
                lines.append(f"    {name}: {spec['description']}")
    lines.append(
        'To call a tool, reply with only a JSON object like {"name": "<tool>", "arguments": {"<parameter>": <value>}}. '
        "The result comes back in the next message; then answer the user."
    )
    return "\n".join(lines)


@dataclass
class ToolConversation:
    """What the node's prompt was rendered from, so each tool turn renders consistently after it."""

    tokenizer: Any
    messages: list[dict[str, Any]]
    tools: tuple[dict[str, Any], ...] | None  # passed to the template; None: described in the system prompt
    form: CallForm = "json"  # how the prompt asked for calls: the form constrained turns write (tool_grammar.py)

    def render(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
        options: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation_prompt,
                                   "enable_thinking": False}
        if self.tools is not None:
            options["tools"] = list(self.tools)
        return self.tokenizer.apply_chat_template(messages, **options)


def tool_prompt(tokenizer: Any, system: str, content: str, toolbox: Toolbox) -> tuple[str, ToolConversation]:
    """The node's prompt with its tools described, and the conversation later turns extend.

    The template's tool format when it has one (rendering with `tools` changes the text);
    otherwise the plain-text description joins the system prompt. Models without a chat
    template get the plain-text description as well.
    """
    user = {"role": "user", "content": content}
    if getattr(tokenizer, "chat_template", None):
        base = ([{"role": "system", "content": system}] if system else []) + [user]
        native = ToolConversation(tokenizer, base, toolbox.schemas)
        plain = ToolConversation(tokenizer, base, None)
        try:
            with_tools = native.render(base, generation_prompt=True)
        except Exception:  # a template that refuses the tools keyword
            with_tools = None
        if with_tools is not None and with_tools != plain.render(base, generation_prompt=True):
            native.form = call_form(with_tools, native_tools=True)
            return with_tools, native
        described = (system + "\n\n" if system else "") + describe_tools(toolbox.schemas)
        messages = [{"role": "system", "content": described}, user]
        conversation = ToolConversation(tokenizer, messages, None)
        return conversation.render(messages, generation_prompt=True), conversation
    described = (system + "\n\n" if system else "") + describe_tools(toolbox.schemas)
    return f"{described}\n\n{content}\n", ToolConversation(tokenizer, [], None)


def encode_tool_prompt(tokenizer: Any, text: str, conversation: ToolConversation) -> Any:
    """`tool_prompt`'s text as an `rclc.Encoding`, every message content tokenized as literal
    text like any node prompt (executors/prompts.py): a document holding control-token text
    cannot end its turn because the agent also has tools."""
    if not conversation.messages:  # no chat template: the whole prompt is user text
        return rclc.encode_literal(tokenizer, text)
    options: dict[str, Any] = {"enable_thinking": False}
    if conversation.tools is not None:
        options["tools"] = list(conversation.tools)
    encoding = rclc.encode_chat(tokenizer, conversation.messages, generation_prompt=True, **options)
    if encoding.text != text:  # cannot happen with a deterministic template; never run a prompt we did not show
        raise RuntimeError("the tool prompt rendered differently twice; the chat template is not deterministic")
    return encoding


def tool_turn(
    conversation: ToolConversation, assistant_turns: int, results: Sequence[tuple[str, str]], end_token: str | None
) -> str:
    """The text to append after a generated turn that called tools: the end of that assistant
    turn (what the template puts after its content, less `end_token`, the end-of-turn token
    generation already wrote, if any), the tool results as the template's tool messages, and the next generation prompt.

    Rendered as the difference of two conversations that differ only in the new messages,
    with a placeholder for every assistant turn's content (the template's view of what the
    model wrote does not matter for the difference). A template that cannot render `tool`
    messages gets the results as a user message instead.
    """
    if not conversation.messages:  # no chat template: plain text
        body = "\n".join(f"Result of {name}: {text}" for name, text in results)
        return f"\n{body}\nAnswer:"
    history = list(conversation.messages)
    for _ in range(assistant_turns):
        history.append({"role": "assistant", "content": _SENTINEL})
    attempts = [
        [{"role": "tool", "name": name, "content": text} for name, text in results],
        [{"role": "user", "content": "\n".join(f"Result of {name}: {text}" for name, text in results)}],
    ]
    problem = "the chat template renders no tool turn"
    for added in attempts:
        try:
            before = conversation.render(history, generation_prompt=False)
            after = conversation.render(history + added, generation_prompt=True)
        except Exception as error:  # templates raise on roles they do not know
            problem = f"the chat template refused it: {type(error).__name__}: {error}"
            continue
        if not after.startswith(before) or _SENTINEL not in before:
            continue
        closing = before[before.rindex(_SENTINEL) + len(_SENTINEL):]
        if end_token and closing.startswith(end_token):
            closing = closing[len(end_token):]
        return closing + after[len(before):]
    raise UsageError(f"tools: cannot render tool results for this model ({problem})")


@dataclass
class ToolRun:
    """One executed call, as records and the report show it."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    result: str
    error: str | None
    seconds: float
    form: str

    def to_dict(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "name": self.name, "arguments": self.arguments, "result": self.result,
                "error": self.error, "seconds": self.seconds, "form": self.form}


def result_text(value: Any) -> str:
    """A tool's return value as the text the model reads: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f" ... (cut at {MAX_RESULT_CHARS} characters)"
    return text


async def call_tool(
    function: Callable[..., Any] | McpTool | None, call: ToolCall, timeout: float
) -> tuple[str, str | None]:
    """(result text, error or None): run one call; every failure of the tool becomes an error
    result (an MCP server that died raises ToolServerFailed: the node fails)."""
    if call.problem is not None or function is None:
        error = call.problem or f"unknown tool {call.name!r}"
        return f"error: {error}", error
    if isinstance(function, McpTool):  # the server checks the arguments against its schema
        value, error = await function.call(dict(call.arguments), timeout)
        return (result_text(value) if error is None else value), error
    try:
        inspect.signature(function).bind(**call.arguments)
    except TypeError as error:
        message = f"bad arguments for {call.name}: {error}"
        return f"error: {message}", message
    try:
        if inspect.iscoroutinefunction(function):
            with anyio.fail_after(timeout):
                value = await function(**call.arguments)
        else:
            value = await call_in_own_thread(lambda: function(**call.arguments), timeout=timeout,
                                             name=f"tool {call.name!r}")
    except (TimeoutError, CallTimedOut):
        message = f"TimeoutError: {call.name} took longer than {timeout:g} s"
        return f"error: {message}", message
    except Exception as error:  # the tool's own failure is the model's information, not a crash
        message = f"{type(error).__name__}: {error}"
        return f"error: {message}", message
    return result_text(value), None


@dataclass
class ToolLoopResult:
    """What the loop produced: the final turn's text, token counts, and the positions it added."""

    text: str
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    tail: list[tuple[str, int]] = field(default_factory=list)  # (lineage kind, positions) after the prompt
    calls: list[ToolRun] = field(default_factory=list)


async def run_tool_loop(
    *,
    node: str,
    agent_spec: AgentSpec,
    toolbox: Toolbox,
    conversation: ToolConversation,
    agent: Any,
    generate: Generate,
    publish: Callable[[str, dict[str, Any]], Awaitable[Any]],
    prompt: Any,
    deliveries: int,
    answer_schema: dict[str, Any] | None = None,
) -> ToolLoopResult:
    """The bounded loop (module docstring): generate, run the calls, append, generate again.
    With `constrain_tools` each turn is decoded under the tools' grammar (tool_grammar.py);
    `answer_schema` (the node's output_schema) then shapes the answer turn too."""
    loop = ToolLoopResult(text="")
    eos_ids = _eos_ids(agent)

    def constraint() -> Any:
        if not agent_spec.constrain_tools:
            return None
        # required: no answer before a call returned without an error (within max_tool_calls)
        answered = any(call.error is None for call in loop.calls)
        return format_constraint(turn_format(
            toolbox.schemas, form=conversation.form, may_call=len(loop.calls) < agent_spec.max_tool_calls,
            must_call=agent_spec.tool_choice == "required" and not answered, answer_schema=answer_schema))

    # the first turn: the prompt as the agent takes it
    result = await generate(prompt, deliveries=deliveries, constraint=constraint())
    turns = 0
    while True:
        turns += 1
        loop.generated_tokens += result.tokens
        loop.generation_seconds += result.seconds
        loop.tail.append(("token", result.tokens))
        loop.text = result.text
        spent = len(loop.calls)
        if spent >= agent_spec.max_tool_calls:
            break
        raw = agent.tokenizer.decode(list(result.token_ids), skip_special_tokens=False)
        calls = parse_tool_calls(raw, toolbox.names)[: agent_spec.max_tool_calls - spent]
        if not calls:
            break
        results = []
        for call in calls:
            call_id = f"{node}#{len(loop.calls) + 1}"
            function = toolbox.functions.get(call.name)
            await publish("tool", {"node": node, "phase": "call", "call_id": call_id, "name": call.name,
                                   "arguments": call.arguments,
                                   **({"server": function.server} if isinstance(function, McpTool) else {})})
            began = time.perf_counter()
            text, error = await call_tool(function, call, agent_spec.tool_timeout)
            run = ToolRun(call_id, call.name, dict(call.arguments), text, error, time.perf_counter() - began, call.form)
            loop.calls.append(run)
            await publish("tool", {"node": node, "phase": "result", "call_id": call_id, "name": call.name,
                                   "result": text, "error": error})
            results.append((call.name or "tool", text))
        last = result.token_ids[-1] if result.token_ids else None
        end = agent.tokenizer.decode([last], skip_special_tokens=False) if last in eos_ids else None
        turn = tool_turn(conversation, turns, results, end)
        held = agent.inspect()["cached_positions"]
        await agent.append(turn)
        loop.tail.append(("tool", agent.inspect()["cached_positions"] - held))
        result = await generate(from_state=True, constraint=constraint())
    return loop


def _eos_ids(agent: Any) -> set[int]:
    ids: set[int] = set()
    for value in (getattr(getattr(agent.model, "generation_config", None), "eos_token_id", None),
                  getattr(agent.tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(item for item in value if isinstance(item, int))
    return ids
