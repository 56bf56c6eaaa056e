"""What a run's spans say in OpenTelemetry's GenAI semantic conventions: span names, the
`gen_ai.*` attributes of workflows, agents, model calls and tools, and message content only
when the user opts in.

We follow the GenAI conventions as published with OpenTelemetry semantic conventions v1.41
(docs/gen-ai, status Development; now maintained in open-telemetry/semantic-conventions-genai),
the "latest experimental" set: `gen_ai.provider.name` (not the deprecated `gen_ai.system`),
`gen_ai.usage.input_tokens` / `output_tokens`, `invoke_workflow`, `invoke_agent` and
`execute_tool` spans. The mapping (docs/streaming.md#genai-semantic-conventions):

    run          invoke_workflow <graph>   gen_ai.workflow.name
    agent node   invoke_agent <node>       gen_ai.agent.name, request settings, usage over its generations
    generation   chat <model>              one model call of the node (a tool loop makes several)
    tool call    execute_tool <tool>       gen_ai.tool.name, gen_ai.tool.call.id, gen_ai.tool.type

Message content (system instructions, input and output messages, tool arguments and
results) may hold personal data; it is recorded only when the environment variable
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT is `true`, as JSON strings in the
conventions' message formats (span attributes cannot hold structured values yet).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

from rclc.models import EMBEDDED_CHECKPOINT

from ..plan.dag import PlanNode

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""`true` records message content on the spans (off by default: it may hold personal data)."""

PROVIDERS = {"hf": "huggingface", "vllm": "vllm", "openai": "openai"}
"""gen_ai.provider.name per model backend: in-process transformers, in-process vLLM, an
OpenAI-compatible server (the API flavour the conventions key on)."""

_ERROR_CLASS = re.compile(r"(?:^|: )([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception|Failed|Timeout|Exit)): ")


def capture_content() -> bool:
    """Whether the user opted in to message content on spans (read per run)."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"


def model_name(node: PlanNode) -> str:
    """gen_ai.request.model: the model a node's agent asks, as its source names it."""
    spec = node.model
    if spec is None:
        return ""
    if spec.is_api:
        return spec.model or spec.name
    return EMBEDDED_CHECKPOINT if spec.source == "embedded" else spec.source


def in_process(node: PlanNode) -> bool:
    """Whether the node's model runs in this process (INTERNAL model-call spans) or behind a server (CLIENT)."""
    return node.model is not None and not node.model.is_api


def agent_attributes(node: PlanNode, run_id: str) -> dict[str, Any]:
    """An `invoke_agent` span's attributes known when the node starts (the sampling-relevant ones)."""
    spec, agent = node.model, node.agent
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": PROVIDERS.get(spec.backend, spec.backend) if spec is not None else "",
        "gen_ai.agent.name": node.name,
        "gen_ai.request.model": model_name(node),
        "gen_ai.conversation.id": run_id,
    }
    if agent is not None and agent.description:
        attributes["gen_ai.agent.description"] = agent.description
    return {**attributes, **request_attributes(node), **server_attributes(node)}


def request_attributes(node: PlanNode, run_seed: int | None = None) -> dict[str, Any]:
    """The request settings every model call of the node uses."""
    agent = node.agent
    if agent is None:
        return {}
    attributes: dict[str, Any] = {"gen_ai.request.max_tokens": agent.max_new_tokens}
    if agent.temperature is not None:
        attributes["gen_ai.request.temperature"] = float(agent.temperature)
        if run_seed is not None:
            attributes["gen_ai.request.seed"] = node.sampling_seed(run_seed)
    if agent.top_p is not None:
        attributes["gen_ai.request.top_p"] = float(agent.top_p)
    return attributes


def server_attributes(node: PlanNode) -> dict[str, Any]:
    """server.address and server.port of an API model's server (nothing for in-process models)."""
    spec = node.model
    if spec is None or not spec.is_api or not spec.base_url:
        return {}
    parts = urlsplit(spec.base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"server.address": parts.hostname or "", "server.port": port}


def chat_attributes(
    node: PlanNode, run_id: str, *, input_tokens: int | None, output_tokens: int, finish: str
) -> dict[str, Any]:
    """A `chat <model>` span's attributes: one generation of the node (input tokens left out
    when unknown: an API model's request is counted by its server)."""
    spec = node.model
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDERS.get(spec.backend, spec.backend) if spec is not None else "",
        "gen_ai.request.model": model_name(node),
        "gen_ai.conversation.id": run_id,
        **({"gen_ai.usage.input_tokens": input_tokens} if input_tokens is not None else {}),
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.response.finish_reasons": (finish,),
        **request_attributes(node),
        **server_attributes(node),
    }


def finish_reason(tokens: int, max_tokens: int | None, *, called_tools: bool) -> str:
    """Why a generation ended: `tool_call` when its turn called tools, `length` when it used
    every token it could, else `stop` (it wrote its end of turn)."""
    if called_tools:
        return "tool_call"
    return "length" if max_tokens is not None and tokens >= max_tokens else "stop"


def error_type(message: str | None) -> str:
    """error.type for a failure known by its message: the exception class it names, else `_OTHER`."""
    found = _ERROR_CLASS.search(message or "")
    return found.group(1) if found else "_OTHER"


# -- opt-in content -------------------------------------------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "content": text}


def system_instructions(system: str) -> dict[str, Any]:
    """gen_ai.system_instructions, when the agent has a system prompt."""
    return {"gen_ai.system_instructions": _json([text_part(system)])} if system else {}


def tool_call_part(call: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "tool_call", "id": call.get("call_id"), "name": call.get("name"),
            "arguments": call.get("arguments")}


def conversation(content: str, turns: Iterable[list[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The messages a generation read: the node's user turn, then each earlier turn's tool calls
    (the assistant's) and their results (the tools')."""
    messages: list[dict[str, Any]] = [{"role": "user", "parts": [text_part(content)]}]
    for calls in turns:
        messages.append({"role": "assistant", "parts": [tool_call_part(call) for call in calls]})
        messages.append({"role": "tool", "parts": [
            {"type": "tool_call_response", "id": call.get("call_id"), "response": call.get("result")} for call in calls
        ]})
    return messages


def output_message(text: str | None, calls: list[Mapping[str, Any]], finish: str) -> dict[str, Any]:
    """One generation's output: the tool calls it made, or the text it wrote."""
    parts = [tool_call_part(call) for call in calls] if calls else [text_part(text or "")]
    return {"role": "assistant", "parts": parts, "finish_reason": finish}


def messages_attributes(inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"gen_ai.input.messages": _json(inputs), "gen_ai.output.messages": _json(outputs)}


def tool_arguments(arguments: Any) -> dict[str, Any]:
    return {"gen_ai.tool.call.arguments": _json(arguments)}


def tool_result(result: Any) -> dict[str, Any]:
    return {"gen_ai.tool.call.result": result if isinstance(result, str) else _json(result)}
