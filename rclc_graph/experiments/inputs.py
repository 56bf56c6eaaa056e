"""How a dataset case becomes a topology's run inputs.

A case has a question and a list of documents; a topology declares its own inputs. The
mapping names the topology input that receives each:

    question  -> the `str` input called `question`
    documents -> the topology's one `list[str]` input, whatever it is called
                 (fanout_qa: `documents`, one reader per document;
                  chain_of_agents: `chunks`, the documents are the chain's chunks, in order)

When a topology declares several list inputs, the one called `documents` is used; otherwise
the mapping must be given explicitly (`--map documents=NAME`). Every other declared input
needs a default, since the dataset has nothing to give it.

A topology that reads fixed items (`{chunks[0]}` ... `{chunks[3]}`) and never the whole list
or a foreach over it needs exactly that many documents: fewer cannot be rendered, and more
would be silently dropped (possibly the gold one), so both are errors that name the case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..errors import PlanError, Problem, UsageError
from ..spec import templates
from ..spec.models import GraphSpec
from .datasets import Case

CASE_FIELDS = ("question", "documents")


@dataclass(frozen=True)
class InputMapping:
    """Topology input names receiving the case's question and documents."""

    question: str
    documents: str

    def inputs(self, case: Case) -> dict[str, Any]:
        return {self.question: case.question, self.documents: list(case.documents)}

    def to_dict(self) -> dict[str, str]:
        return {"question": self.question, "documents": self.documents}


def parse_mapping(items: Iterable[str]) -> dict[str, str]:
    """["documents=chunks", ...] -> {"documents": "chunks"}; ValueError names the bad item."""
    mapping: dict[str, str] = {}
    for item in items:
        field, sep, name = item.partition("=")
        field, name = field.strip(), name.strip()
        if not sep or not name:
            raise UsageError(f"map: {item!r} is not FIELD=INPUT (e.g. documents=chunks)")
        if field not in CASE_FIELDS:
            raise UsageError(f"map: {field!r} is not a case field; map one of {', '.join(CASE_FIELDS)}")
        if field in mapping:
            raise UsageError(f"map: {field!r} is mapped twice")
        mapping[field] = name
    return mapping


def resolve_mapping(spec: GraphSpec, explicit: Mapping[str, str] | None = None) -> InputMapping:
    """The mapping for `spec` (explicit entries win); PlanError (E_INPUT) says what is missing."""
    explicit = dict(explicit or {})
    for field in explicit:
        if field not in CASE_FIELDS:
            raise UsageError(f"mapping: {field!r} is not a case field; map one of {', '.join(CASE_FIELDS)}")
    declared = spec.input_specs()
    problems: list[Problem] = []

    question = explicit.get("question", "question")
    if question not in declared:
        problems.append(
            Problem(
                "E_INPUT",
                f"topology {spec.name!r} declares no input {question!r} for the case's question",
                f"declare `{question}: str` under inputs, or map it: --map question=INPUT (declared: {', '.join(declared) or 'none'})",
                ("inputs",),
            )
        )
    elif declared[question].type != "str":
        problems.append(
            Problem("E_INPUT", f"input {question!r} receives the question but is a {declared[question].type}",
                    "declare it as str, or map the question elsewhere", ("inputs", question))
        )

    lists = [name for name, input_spec in declared.items() if input_spec.type == "list[str]"]
    documents = explicit.get("documents")
    if documents is None:
        if len(lists) == 1:
            documents = lists[0]
        elif "documents" in lists:
            documents = "documents"
        else:
            found = f"declares list inputs {', '.join(lists)}" if lists else "declares no list[str] input"
            problems.append(
                Problem("E_INPUT", f"topology {spec.name!r} {found}; the case's documents need exactly one",
                        "map them explicitly: --map documents=INPUT" if lists else "declare a list[str] input for the documents",
                        ("inputs",))
            )
    if documents is not None:
        if documents not in declared:
            problems.append(
                Problem("E_INPUT", f"topology {spec.name!r} declares no input {documents!r} for the case's documents",
                        f"declared: {', '.join(declared) or 'none'}", ("inputs",))
            )
        elif declared[documents].type != "list[str]":
            problems.append(
                Problem("E_INPUT", f"input {documents!r} receives the documents but is a str",
                        "declare it as list[str], or map the documents elsewhere", ("inputs", documents))
            )
    if documents is not None and documents == question:
        problems.append(Problem("E_INPUT", f"question and documents both map to {question!r}", "map them to different inputs", ("inputs",)))

    for name, input_spec in declared.items():
        if name not in (question, documents) and input_spec.default is None:
            problems.append(
                Problem("E_INPUT", f"input {name!r} has no default and the dataset has no field for it",
                        f"give {name} a default in the topology", ("inputs", name))
            )
    if problems:
        raise PlanError(problems)
    assert documents is not None
    return InputMapping(question=question, documents=documents)


def documents_read(spec: GraphSpec, list_input: str) -> int | None:
    """How many items of `list_input` the topology reads: None when it reads the whole list
    (a foreach over it, or `{name}` in a template), else 1 + the largest `{name[i]}` index."""
    templates_used = [node.prompt for node in spec.nodes]
    templates_used += [policy.request for policy in spec.policies.values() if policy.request]
    templates_used += [edge.policy.request for edge in spec.edges
                       if edge.policy is not None and not isinstance(edge.policy, str) and edge.policy.request]
    if any(node.foreach == list_input for node in spec.nodes):
        return None
    largest = -1
    for template in templates_used:
        for found in templates.fields(template):
            if found.name != list_input:
                continue
            if found.index is None:
                return None
            largest = max(largest, found.index)
    return largest + 1 if largest >= 0 else 0


def check_case_fits(spec: GraphSpec, mapping: InputMapping, case: Case) -> None:
    """PlanError (E_INPUT) when the topology would read fewer or more documents than the case has."""
    needed = documents_read(spec, mapping.documents)
    have = len(case.documents)
    if needed is None or needed == have:
        return
    if needed == 0:
        message = f"case {case.id!r}: topology {spec.name!r} never reads {mapping.documents!r}, so its {have} documents would be ignored"
        fix = "use a topology that reads the documents, or map them to another input"
    elif have < needed:
        message = f"case {case.id!r} has {have} documents but topology {spec.name!r} reads {needed} items of {mapping.documents!r}"
        fix = f"give every case {needed} documents (rclc-graph data make --documents {needed})"
    else:
        message = (f"case {case.id!r} has {have} documents but topology {spec.name!r} reads only {needed} items of "
                   f"{mapping.documents!r}; the rest would be silently dropped")
        fix = f"give every case {needed} documents (rclc-graph data make --documents {needed})"
    raise PlanError([Problem("E_INPUT", message, fix, ("inputs", mapping.documents))])
