"""Nodes on `backend: openai` models: one chat completion from an OpenAI-compatible server.

Such a model is a server (a hosted API, or `vllm serve` on this machine), not weights in
this process: the node sends the same user turn a local node reads (its text handoffs, then
its prompt) with the agent's system prompt, streams the answer back as token events, and
its text is all it leaves. There is no rclc state, so only `text` edges touch these nodes
(planning refuses the rest) and records hold no snapshot for them; a finished API node is
not called again on resume.

The client is the `openai` package (the optional extra `rclc-graph[openai]`): it is the
reference client for this wire format and already retries what is worth retrying
(connection errors, timeouts, 408, 409, 429 and 5xx) with exponential backoff. The key is
read from the environment variable the YAML names (`api_key_env`) when the request is
made; it is never put in specs, records, events, errors or reports. Every failure that
remains after the retries is an `ApiModelFailed` naming the model, the server and what to
check, which fails the node (and the run, which can be resumed once the server is back).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from ..errors import ApiModelFailed, ExecutorUnavailable, NodeFailed, node_failed
from ..plan.dag import PlanNode
from ..results.lineage import Lineage, compose_hop
from ..results.run_events import hop_payload
from ..results.run_result import NodeResult
from ..spec.models import ModelSpec
from .contract import Inbound, RunContext
from .loaded_model import LoadedModel, ModelKey
from .prompts import compose_content
from .structured import closed, parse_output, response_format

NO_KEY = "unused"
"""What is sent as the key when the model names no `api_key_env` (local servers ignore it)."""


class ApiModel(LoadedModel):
    """A `backend: openai` model in the pool: no weights; its identity is the server and model name."""

    @property
    def fingerprint(self) -> str:
        """sha256 of backend, base URL and model name (the server's weights are not ours to hash)."""
        data = {"backend": self.key.backend, "base_url": self.key.source, "model": self.key.api_model}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def load_model(key: ModelKey) -> ApiModel:
    """The pool's entry for an API model (nothing is loaded or contacted)."""
    return ApiModel(key, None, None)


def api_key(spec: ModelSpec) -> str:
    """The key from the environment variable `spec.api_key_env` names (read now, never stored)."""
    if spec.api_key_env is None:
        return NO_KEY
    value = os.environ.get(spec.api_key_env)
    if not value:
        raise ApiModelFailed(
            f"model {spec.name!r}: environment variable {spec.api_key_env} (api_key_env) is not set; "
            f"export {spec.api_key_env}=<your key> before the run"
        )
    return value


def client(spec: ModelSpec) -> Any:
    """An `openai.AsyncOpenAI` client for `spec` (timeout and retries from the spec)."""
    try:
        import openai  # lazy: an optional extra, needed only by graphs with API models
    except ImportError:
        raise ExecutorUnavailable(
            f"model {spec.name!r} uses backend openai, which needs the openai package; "
            "install it with pip install 'rclc-graph[openai]'"
        ) from None
    return openai.AsyncOpenAI(
        base_url=spec.base_url, api_key=api_key(spec), timeout=spec.timeout, max_retries=spec.max_retries
    )


def request(node: PlanNode, content: str, seed: int) -> dict[str, Any]:
    """The chat-completion request a node sends (greedy unless the agent sets a temperature)."""
    agent = node.agent
    messages = ([{"role": "system", "content": agent.system}] if agent.system else []) + [
        {"role": "user", "content": content}
    ]
    body: dict[str, Any] = {
        "model": node.model.model,
        "messages": messages,
        "max_tokens": agent.max_new_tokens,
        "temperature": 0.0 if agent.temperature is None else agent.temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if agent.top_p is not None:
        body["top_p"] = agent.top_p
    if node.output_schema is not None:  # the server constrains its output (structured outputs); checked after
        body["response_format"] = response_format(node.name, closed(node.output_schema))
    return body


def describe_failure(spec: ModelSpec, error: BaseException) -> ApiModelFailed:
    """An ApiModelFailed saying what went wrong with the server, in the user's terms."""
    import openai

    where = f"model {spec.name!r} ({spec.model} at {spec.base_url})"
    retries = f" after {spec.max_retries} retries" if spec.max_retries else ""
    if isinstance(error, openai.APITimeoutError):
        return ApiModelFailed(
            f"{where}: no answer within the {spec.timeout:g} s timeout{retries}; "
            "check the server is up and not overloaded, or raise timeout"
        )
    if isinstance(error, openai.APIConnectionError):
        cause = error.__cause__ or error.__context__
        detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        return ApiModelFailed(
            f"{where}: cannot connect{retries}{detail}; check the server is running and base_url is right"
        )
    if isinstance(error, openai.APIStatusError):
        hint = {401: "check the key in the variable api_key_env names", 403: "check the key's permissions",
                404: "check model (the name the server serves) and base_url (usually ends in /v1)",
                429: "the server is rate limiting: wait, or lower concurrency"}.get(
            error.status_code, "see the server's log")
        return ApiModelFailed(f"{where}: the server answered {error.status_code}{retries}: {_message(error)}; {hint}")
    return ApiModelFailed(f"{where}: {type(error).__name__}: {error}")


def _message(error: Any) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
        if isinstance(body.get("message"), str):
            return body["message"][:300]
    return str(getattr(error, "message", error))[:300]


async def run_api_node(ctx: RunContext, node: PlanNode, inbound: Inbound) -> NodeResult:
    """Run one node on its API model; NodeFailed (cause ApiModelFailed) when the server fails."""
    started = time.time()
    content = compose_content(node, inbound)
    body = request(node, content, node.sampling_seed(ctx.seed))
    hops = [
        compose_hop(Lineage(), [], source=edge.source, target=node.name, inherited_positions=0, budget=0,
                    payload_bytes=len((result.text or "").encode("utf-8")), mode="text", policy="text", edge=edge.id)
        for edge, result in inbound
    ]
    for hop in hops:  # text handoffs are in the request: delivered before the server answers
        await ctx.publish("hop", hop_payload(hop))
    pieces: list[str] = []
    completion_tokens: int | None = None
    began = time.perf_counter()
    try:
        api = client(node.model)
        async with api:
            stream = await api.chat.completions.create(**body)
            async for chunk in stream:
                usage = getattr(chunk, "usage", None)
                if usage is not None and getattr(usage, "completion_tokens", None) is not None:
                    completion_tokens = int(usage.completion_tokens)
                for choice in chunk.choices or ():
                    text = getattr(choice.delta, "content", None)
                    if text:
                        await ctx.publish("token", {"node": node.name, "index": len(pieces), "text": text})
                        pieces.append(text)
    except (ApiModelFailed, ExecutorUnavailable) as error:
        raise NodeFailed(node.name, error) from None
    except Exception as error:  # the client's errors, turned into one that says what to check
        if type(error).__module__.startswith("openai"):
            raise NodeFailed(node.name, describe_failure(node.model, error)) from None
        raise NodeFailed(node.name, error) from error
    seconds = time.perf_counter() - began
    text = "".join(pieces).strip()
    if node.output_schema is not None:
        with node_failed(node.name):
            parse_output(node.name, node.output_schema, text, max_new_tokens=node.agent.max_new_tokens,
                         tokens=completion_tokens if completion_tokens is not None else len(pieces))
    return NodeResult.stateless(
        node.name, text, prompt_text=json.dumps(body["messages"], ensure_ascii=False), started_at=started,
        hops=[hop.record for hop in hops], generation_seconds=seconds,
        generated_tokens=completion_tokens if completion_tokens is not None else len(pieces),
    )
