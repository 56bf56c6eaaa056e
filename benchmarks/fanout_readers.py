"""The fanout_qa readers' prompts as topologies/fanout_qa.yaml binds them, with each token's
role (instruction or material), for the benchmarks that score readers' states outside a
graph run (pooled_allocation.py, span_scores.py). One definition, so both score exactly the
prompts the shipped topology builds; imported as a sibling module (a script's own folder is
first on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import rclc
from rclc_graph.executors.roles import INSTRUCTION, MATERIAL, char_roles, token_roles
from rclc_graph.spec.templates import render_spans

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = yaml.safe_load((ROOT / "topologies" / "fanout_qa.yaml").read_text())
READER_TEMPLATE = next(node["prompt"] for node in TOPOLOGY["nodes"] if node["name"] == "reader")
FINAL_TEMPLATE = next(node["prompt"] for node in TOPOLOGY["nodes"] if node["name"] == "final")
SYSTEM = {name: yaml.safe_load((ROOT / "agents" / f"{name}.yaml").read_text())["system"] for name in ("reader", "answerer")}


def template_parts(template: str, values: dict) -> list[tuple[str, str]]:
    """The rendered template as (text, role) parts: filled-in values are material, the
    template's own words instruction."""
    text, spans = render_spans(template, values)
    parts, cursor = [], 0
    for start, stop in spans:
        parts += [(text[cursor:start], INSTRUCTION), (text[start:stop], MATERIAL)]
        cursor = stop
    return [part for part in parts + [(text[cursor:], INSTRUCTION)] if part[0]]


def reader_prompt(model: Any, tokenizer: Any, case: dict, index: int) -> tuple[Any, list[str], str, list[tuple[int, int]]]:
    """Reader `index` of `case` bound as the topology binds it: its sender state, each
    position's role, the chat-templated prompt text and each token's character offsets."""
    values = {"question": case["question"], "document": case["documents"][index], "index": index}
    parts = template_parts(READER_TEMPLATE, values)
    content = "".join(text for text, _ in parts)
    messages = [{"role": "system", "content": SYSTEM["reader"]}, {"role": "user", "content": content}]
    prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    encoded = tokenizer(prompt_text, add_special_tokens=False, return_offsets_mapping=True)
    special_ids = set(tokenizer.all_special_ids)
    special = [token in special_ids for token in encoded["input_ids"]]
    offsets = [tuple(pair) for pair in encoded["offset_mapping"]]
    roles = token_roles(char_roles(prompt_text, SYSTEM["reader"], parts), offsets, special)
    state = rclc.bind(model, tokenizer, messages=messages).sender_state()
    return state, roles, prompt_text, offsets
