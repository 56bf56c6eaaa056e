"""Shared pieces of the tool-calling tests: tools to call, family-style chat templates, and a
forward hook that makes a tiny random model write a fixed text.

Tiny random models never call a tool on their own, so the mechanics (parsing, running,
appending, generating again, lineage, records) are tested by forcing what they generate:
`scripted(model, tokenizer, replies)` puts a hook on the LM head that, at every decoding step,
makes the next token of the script the only possible one. Each reply ends with the
tokenizer's EOS, so every generation stops where its reply ends. The functions below are
importable as `tests.helpers.tools:<name>` (the repository root is on sys.path), the form topologies name
tools in.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Literal

from tests.helpers.scripted_tools import scripted  # noqa: F401 - the tests import it from here

PROJECTS = {"cedar": {"owner": "Alice", "city": "Oslo"}, "birch": {"owner": "Bob", "city": "Lima"}}


def project_owner(project: str) -> dict[str, str]:
    """Who owns a project, and where it launched.

    Args:
        project: The project's name, for example Cedar.
    """
    found = PROJECTS.get(project.strip().lower())
    if found is None:
        raise LookupError(f"no project {project!r}")
    return dict(found)


def project_city(project: Literal["Cedar", "Birch"], detail: bool = False) -> str:
    """Where a project launched (its arguments are bounded: a random model's call of it ends).

    Args:
        project: The project's name.
        detail: Whether to add the owner.
    """
    found = PROJECTS[project.lower()]
    return f"{found['city']} (owner {found['owner']})" if detail else found["city"]


def project_year(project: Literal["Cedar", "Birch"]) -> int:
    """The year a project launched (bounded arguments, like project_city).

    Args:
        project: The project's name.
    """
    return {"cedar": 2021, "birch": 2019}[project.lower()]


def slow_lookup(project: str) -> str:
    """A look-up that takes two seconds.

    Args:
        project: The project's name.
    """
    time.sleep(2.0)
    return "too late"


async def async_owner(project: str) -> str:
    """The owner of a project, looked up asynchronously.

    Args:
        project: The project's name.
    """
    return PROJECTS[project.strip().lower()]["owner"]


def undocumented(project):  # no type hints, no docstring: cannot be described to a model
    return project


# Qwen's Hermes-style template, reduced to what the tiny tokenizer has: tools in the system
# turn, calls in <tool_call> tags, results grouped in one user turn as <tool_response> blocks.
QWEN_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' }}{{ message.content }}{{ '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Llama 3.1's convention on the tiny tokenizer's markers: tools described in the first user
# turn, a call answered as {"name": ..., "parameters": ...}, results in an `ipython` turn.
LLAMA_TEMPLATE = (
    "{%- set ns = namespace(first=true) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}<|im_start|>ipython\n{{ message.content }}<|im_end|>{{ '\\n' }}"
    "{%- elif message.role == 'user' and tools and ns.first %}{% set ns.first = false %}<|im_start|>user\n"
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that "
    "best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}.\n\n{% for tool in tools %}{{ tool | tojson }}\n\n{% endfor %}"
    "{{ message.content }}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def call_text(family: str, name: str, arguments: dict[str, Any]) -> str:
    """A call as a model of `family` writes it."""
    import json

    if family == "llama":
        return json.dumps({"name": name, "parameters": arguments})
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def family_tokenizer(tokenizer: Any, family: str | None) -> Any:
    """A copy of the tiny tokenizer with the family's tool template (None: its plain ChatML)."""
    copied = copy.deepcopy(tokenizer)
    if family == "qwen3":
        copied.chat_template = QWEN_TEMPLATE
    elif family == "llama":
        copied.chat_template = LLAMA_TEMPLATE
    return copied
