"""What a node's model reads: the user turn built from text handoffs and the node's own prompt,
rendered with the model's chat template, user text kept literal (`rclc.encode_chat`).

Shared by every place that must count or build the same prompt: the local executor (the
prompt it prefills), the remote executor (what a transfer group's selection is conditioned
on, computed where the scheduler runs) and preflight (the tokens a prompt takes, before any
model loads).
"""

from __future__ import annotations

from typing import Any

import rclc

from ..plan.dag import PlanEdge, PlanNode
from ..results.run_result import NodeResult


def compose_content(node: PlanNode, inbound: list[tuple[PlanEdge, NodeResult]]) -> str:
    """The user turn of a node: each text sender's answer (edge order), then its own prompt."""
    texts = [
        f"Message from {edge.source}:\n{result.effective_text.strip()}" for edge, result in inbound
        if edge.policy.mode == "text"
    ]
    return "\n\n".join(texts + [node.prompt])


def group_request(lead: PlanEdge, content: str) -> str:
    """What a transfer group's selection is conditioned on: the edge's request, else the receiver's turn."""
    return lead.request if lead.request is not None else content


def render_prompt(tokenizer: Any, system: str, content: str, *, generation_prompt: bool) -> Any:
    """The node's prompt as an `rclc.Encoding` (text, ids, offsets): its chat template when it
    has one, else plain text.

    Everything in `content` and `system` came from users (inputs, documents, other nodes'
    outputs) and is tokenized as literal text by the core (`rclc.encode_chat`): a document
    containing `<|im_end|>` cannot end the turn. Only the template's delimiters are control
    tokens. Without a template the whole prompt is user text.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
        return rclc.encode_chat(tokenizer, messages, generation_prompt=generation_prompt, enable_thinking=False)
    return rclc.encode_literal(tokenizer, f"{system}\n\n{content}\n" if system else f"{content}\n")
