"""What each position of a node's state holds: material, instructions or chat-template markup.

Receiver-aware selection (`rclc.Exclusion`, an edge's `exclude:`) passes over a sender's
positions that carry none of its own content. The core cannot tell a reader's system prompt
from the document it read; the graph can, because it built the prompt: the agent's `system`
text and the fixed text of the node's prompt template are instructions, the values rendered
into the template (inputs such as a document or the question) and the text senders wrote
are material, and whatever the chat template adds around the messages is markup. Tokens are
labelled from those character ranges through the tokenizer's offsets; a token that holds
any material character is material (the safe side: material is never passed over for its
role).

A node's full state is its inherited rows, then its prompt, then what it generated. Roles
travel with the rows like lineage does: a receiver's inherited rows take the labels of the
sender positions that were kept (`take`), rows reasoning added are material, and its own
prompt and generated tokens are labelled here. `NodeResult.roles` stores the result as
runs of (role, length).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

from ..plan.dag import PlanEdge, PlanNode
from ..results.run_result import NodeResult
from ..errors import UsageError

MATERIAL, INSTRUCTION, TEMPLATE = "material", "instruction", "template"
Runs = tuple[tuple[str, int], ...]


def compress(labels: Sequence[str]) -> Runs:
    """Labels as runs of (role, length)."""
    return tuple((role, sum(1 for _ in group)) for role, group in groupby(labels))


def expand(runs: Runs | None, length: int) -> list[str]:
    """Runs back to one label per position; None (a record without roles) is all material."""
    if runs is None:
        return [MATERIAL] * length
    labels = [role for role, count in runs for _ in range(count)]
    if len(labels) != length:
        raise UsageError(f"roles: {len(labels)} labels for a state of {length} positions")
    return labels


def content_parts(node: PlanNode, inbound: list[tuple[PlanEdge, NodeResult]]) -> list[tuple[str, str]]:
    """The node's user turn as (text, role) pieces; their texts join to `compose_content`'s result."""
    parts: list[tuple[str, str]] = []
    for edge, result in inbound:
        if edge.policy.mode != "text":
            continue
        if parts:
            parts.append(("\n\n", INSTRUCTION))
        parts.append((f"Message from {edge.source}:\n", INSTRUCTION))
        parts.append(((result.text or "").strip(), MATERIAL))
    if parts:
        parts.append(("\n\n", INSTRUCTION))
    cursor = 0
    for start, stop in node.prompt_values:
        parts.append((node.prompt[cursor:start], INSTRUCTION))
        parts.append((node.prompt[start:stop], MATERIAL))
        cursor = stop
    parts.append((node.prompt[cursor:], INSTRUCTION))
    return [(text, role) for text, role in parts if text]


def char_roles(prompt_text: str, system: str, parts: Sequence[tuple[str, str]]) -> list[str]:
    """One label per character of the rendered prompt.

    The chat template copies the system text and the user turn verbatim (ChatML, Llama and
    Qwen templates do); text found outside them is markup. If a template rewrote the user
    turn so that it cannot be found, the whole turn onwards is labelled material rather
    than guessed.
    """
    labels = [TEMPLATE] * len(prompt_text)
    cursor = 0
    if system:
        found = prompt_text.find(system)
        if found >= 0:
            labels[found : found + len(system)] = [INSTRUCTION] * len(system)
            cursor = found + len(system)
    content = "".join(text for text, _ in parts)
    found = prompt_text.find(content, cursor) if content else -1
    if found < 0:
        if content:
            labels[cursor:] = [MATERIAL] * (len(prompt_text) - cursor)
        return labels
    for text, role in parts:
        labels[found : found + len(text)] = [role] * len(text)
        found += len(text)
    return labels


def token_roles(labels: Sequence[str], offsets: Sequence[tuple[int, int]], special: Sequence[bool]) -> list[str]:
    """One label per prompt token from its characters' labels (any material char: material)."""
    roles = []
    for (start, stop), is_special in zip(offsets, special):
        if is_special:
            roles.append(TEMPLATE)
            continue
        found = set(labels[start:stop])
        roles.append(MATERIAL if MATERIAL in found or not found else INSTRUCTION if INSTRUCTION in found else TEMPLATE)
    return roles


def prompt_roles(tokenizer: Any, node: PlanNode, inbound: list[tuple[PlanEdge, NodeResult]], prompt: Any) -> list[str]:
    """The label of every token of the node's prompt as the agent reads it (`prompt`: an
    `rclc.Encoding`, whose ids and offsets are the literal tokenization the agent prefills).

    A token whose id is one of the tokenizer's special ids is markup: literal encoding only
    gives those ids to the template's delimiters, never to user text.
    """
    if prompt.offsets is None:  # no offsets: nothing can be told apart, so nothing is passed over for its role
        return [MATERIAL] * len(prompt.ids)
    special_ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    special = [token in special_ids for token in prompt.ids]
    labels = char_roles(prompt.text, node.agent.system, content_parts(node, inbound))
    return token_roles(labels, [tuple(pair) for pair in prompt.offsets], special)


def delivered_roles(sender: NodeResult, kept: Sequence[int], source_positions: int, added_latent: int) -> list[str]:
    """Labels of the rows one hop delivered: the sender's labels at the kept indices (rows
    full-context reasoning added before selection, and latent rows added after it, are material)."""
    labels = expand(sender.roles, len(sender.lineage))
    labels += [MATERIAL] * max(source_positions - len(labels), 0)
    return [labels[index] for index in kept] + [MATERIAL] * added_latent


def sender_roles(sender: NodeResult, positions: int) -> list[str]:
    """Labels of a sender's state as a transfer sees it (`positions` rows)."""
    labels = expand(sender.roles, len(sender.lineage))
    return (labels + [MATERIAL] * positions)[:positions]


def sender_span_starts(sender: NodeResult, positions: int) -> list[int]:
    """Where a run of a sender's rows begins (its lineage's run starts), within the `positions`
    rows a transfer sees; rows full-context reasoning adds at the end start one more run."""
    starts = [start for start in sender.lineage.run_starts() if start < positions]
    if 0 < len(sender.lineage) < positions:
        starts.append(len(sender.lineage))
    return starts
