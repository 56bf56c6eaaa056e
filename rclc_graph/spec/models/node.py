"""Nodes: one step of the graph, an agent reading a prompt, a Python function (`call`) or a
whole other topology (`graph`, a subgraph); `foreach` copies a node per item of a list input,
or per item of a JSON list an earlier node writes at run time (`RunTimeForeach`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, PositiveFloat, PositiveInt, Tag, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .fields import (
    ANSWER_VARIABLE,
    DEFAULT_FUNCTION_TIMEOUT,
    RESERVED_VARIABLES,
    Ident,
    Name,
    SpecBase,
    Template,
    is_callable_ref,
    spec_error,
)
from .output_schema import check_output_schema, schema_value

if TYPE_CHECKING:  # graph.py imports this module; NodeSpec is rebuilt there once GraphSpec exists
    from .graph import GraphSpec

DEFAULT_RUNTIME_ITEMS = 16  # copies a run-time foreach plans when max_items is not given
MAX_RUNTIME_ITEMS = 256  # the most max_items may be: every copy is a plan node, decided at run time
_SUBGRAPH_UNUSED = ("prompt", "generate", "interrupt", "question", "timeout")  # fields a subgraph node has no use for


class RunTimeForeach(SpecBase):
    """`foreach: {node: planner, max_items: 8}`: one copy of the node per item of the JSON list
    of strings that node `planner` writes, decided when `planner` finished (LangGraph's `Send`).

    The plan holds `max_items` copies (`name[0]` ... `name[max_items - 1]`); copy i runs with
    item i, copies past the list's end are skipped. A list that is not a JSON list of
    strings, or is longer than `max_items`, fails the node with the reason."""

    node: Name = Field(description="the node whose output is the JSON list (a list of strings) to range over")
    max_items: PositiveInt = Field(
        DEFAULT_RUNTIME_ITEMS, le=MAX_RUNTIME_ITEMS,
        description=f"the most items the list may hold (default {DEFAULT_RUNTIME_ITEMS}, at most {MAX_RUNTIME_ITEMS})",
    )


ForeachRef = Annotated[
    # (tags that are no field name: a tag shows in an error's location, which spec/load.py maps onto the data)
    Union[Annotated[Ident, Tag("by-input")], Annotated[RunTimeForeach, Tag("by-node")]],
    Discriminator(lambda value: "by-input" if isinstance(value, str) else "by-node"),
]
SubgraphRef = Annotated[
    Union[Annotated[str, Tag("file")], Annotated["GraphSpec", Tag("inline")]],
    Discriminator(lambda value: "file" if isinstance(value, str) else "inline"),
]
InputValue = Union[Template, list[Template]]


class NodeSpec(SpecBase):
    """One step of the graph: an agent reading a prompt (rendered from the run's inputs) plus
    whatever its senders hand over, or a Python function (`call`) reading the run's inputs
    and its senders' texts.

    `foreach: documents` repeats the node once per item of the list input `documents`
    (nodes `name[0]`, `name[1]`, ...); inside, `{item}` (or the name set by `item`) is that
    item and `{index}` its position. Nodes in a bounded loop also see `{round}` (1-based).
    `interrupt` stops the run for a person (`before` the node runs, or `after` it ran) and
    asks `question`; their answer continues it (docs/graphs.md#human-in-the-loop).
    `foreach: {node: planner}` ranges over the JSON list `planner` writes, at run time.

    A node with `graph` runs another topology whole (a subgraph, docs/graphs.md#subgraphs):
    `inputs` maps the subgraph's inputs to templates over this node's variables, `returns`
    names the subgraph's output node whose output is this node's.
    """

    name: Name
    # `call` is declared before `agent` so that `agent`'s check can see it (pydantic validates in order)
    call: str | None = Field(
        None, description="package.module:callable: a function node instead of an agent (needs trust_code)"
    )
    # ... and `graph` too: a subgraph node has neither agent nor call
    graph: SubgraphRef | None = Field(
        None, description="a topology file (relative to this file) or an inline topology this node runs whole"
    )
    agent: Name | None = Field(None, validate_default=True, description="the agent that runs this node (or give call)")
    description: str = ""
    prompt: Template = ""
    generate: bool = Field(True, description="false: only read and pass state on (no decoding)")
    output: bool = Field(False, description="true: an answer node of the run")
    foreach: ForeachRef | None = Field(
        None, description="a list[str] input: one copy of the node per item; or {node, max_items}: one copy per "
        "item of the JSON list that node writes at run time"
    )
    item: Ident = Field("item", description="the template variable holding the current foreach item")
    interrupt: Literal["before", "after"] | None = Field(
        None, description="stop the run for a person's answer before this node runs, or after it ran"
    )
    question: Template | None = Field(None, description="what the person is asked (with interrupt)")
    output_schema: dict[str, Any] | None = Field(
        None, description="a JSON Schema the node's output must match: constrained decoding, then validation "
        "(the text is the compact JSON document; a pydantic model class in Python)"
    )
    timeout: PositiveFloat | None = Field(
        None, description=f"function nodes: seconds the call may take (default {DEFAULT_FUNCTION_TIMEOUT:g}); "
        "a slower call fails the node"
    )
    inputs: dict[Ident, InputValue] = Field(
        default_factory=dict, description="subgraph nodes: the subgraph's inputs, each a template over this node's "
        "variables (a list of templates, or \"{name}\" of a list, for a list[str] input); unmapped inputs take "
        "this graph's input of the same name, else their default"
    )
    returns: Name | None = Field(
        None, description="subgraph nodes: the subgraph's output node whose output is this node's "
        "(default: its only output node)"
    )

    @field_validator("call")
    @classmethod
    def _call(cls, value: str | None) -> str | None:
        if value is not None and not is_callable_ref(value):
            raise spec_error("E_FIELD", f"call {value!r} is not a package.module:callable reference",
                         "write the function's module and name, e.g. mypackage.lookups:find_order")
        return value

    @field_validator("output_schema", mode="before")
    @classmethod
    def _output_schema(cls, value: Any) -> Any:
        return None if value is None else check_output_schema(schema_value(value))

    @field_validator("agent")
    @classmethod
    def _agent_or_call(cls, value: str | None, info: ValidationInfo) -> str | None:
        call = info.data.get("call")
        if value is None and call is None and "call" in info.data and "graph" in info.data and info.data["graph"] is None:
            # type "missing", so the error's path names the absent field (spec/load.py)
            raise PydanticCustomError("missing", "required field 'agent' is missing",
                                      {"fix": "add agent: NAME, or call: package.module:function for a function node, "
                                              "or graph: FILE for a subgraph"})
        if value is not None and call is not None:
            raise spec_error("E_FIELD", f"node has both agent {value!r} and call {call!r}",
                         "keep agent for a model node, or call for a function node")
        if info.data.get("graph") is not None and (value is not None or call is not None):
            which = f"agent {value!r}" if value is not None else f"call {call!r}"
            raise spec_error("E_SUBGRAPH", f"node has both graph and {which}",
                             "keep graph for a subgraph node (its own agents run it), or remove graph")
        return value

    @model_validator(mode="after")
    def _item_needs_foreach(self) -> NodeSpec:
        if self.foreach is None and self.item != "item":
            raise spec_error("E_FIELD", f"item {self.item!r} is set without foreach", "add foreach: <list input>, or drop item")
        if self.item in RESERVED_VARIABLES + (ANSWER_VARIABLE,):
            raise spec_error("E_FIELD", f"item {self.item!r} is a reserved variable", "choose another item name")
        return self

    @model_validator(mode="after")
    def _function_fields(self) -> NodeSpec:
        if self.call is not None:
            used = [name for name in ("prompt", "generate", "output_schema") if name in self.model_fields_set
                    and getattr(self, name) != type(self).model_fields[name].default]
            if used:
                raise spec_error("E_FUNCTION", f"function node {self.name!r} sets {', '.join(used)}, which only agents use",
                             f"remove {', '.join(used)}: a function receives the run's inputs and its senders' texts")
        if self.output_schema is not None and not self.generate:
            raise spec_error("E_FIELD", f"node {self.name!r} sets output_schema but generate: false (it writes no output)",
                         "set generate: true, or remove output_schema")
        if self.timeout is not None and self.call is None:
            raise spec_error("E_FIELD", f"node {self.name!r} sets timeout, which only function nodes use",
                         "remove timeout (an agent's generation is bounded by max_new_tokens), or add call:")
        if self.question is not None and self.interrupt is None:
            raise spec_error("E_INTERRUPT", f"node {self.name!r} has a question but no interrupt",
                         "add interrupt: before (or after), or remove question")
        return self

    @model_validator(mode="after")
    def _subgraph_fields(self) -> NodeSpec:
        if self.graph is None:
            used = [name for name in ("inputs", "returns") if getattr(self, name)]
            if used:
                raise spec_error("E_FIELD", f"node {self.name!r} sets {', '.join(used)}, which only subgraph nodes use",
                                 f"remove {', '.join(used)}, or add graph: FILE to run a subgraph")
            return self
        used = [name for name in _SUBGRAPH_UNUSED if getattr(self, name) != type(self).model_fields[name].default]
        if used:
            raise spec_error("E_SUBGRAPH", f"subgraph node {self.name!r} sets {', '.join(used)}, which a subgraph "
                             "node does not use", f"remove {', '.join(used)}: the subgraph's own nodes have prompts "
                             "and generate; put interrupts on them")
        if isinstance(self.foreach, RunTimeForeach):
            raise spec_error("E_SUBGRAPH", f"subgraph node {self.name!r} ranges over node {self.foreach.node!r}'s "
                             "run-time list; a subgraph's inputs are fixed when the run is planned",
                             "range over a list input (foreach: INPUT), or put the run-time foreach on a node "
                             "inside the subgraph")
        return self

    @property
    def is_function(self) -> bool:
        """Whether a Python callable runs this node (`call`) instead of an agent."""
        return self.call is not None

    @property
    def is_subgraph(self) -> bool:
        """Whether this node runs another topology whole (`graph`)."""
        return self.graph is not None

    @property
    def foreach_input(self) -> str | None:
        """The list input this node ranges over (`foreach: INPUT`), or None."""
        return self.foreach if isinstance(self.foreach, str) else None

    @property
    def foreach_node(self) -> str | None:
        """The node whose run-time JSON list this node ranges over (`foreach: {node: ...}`), or None."""
        return self.foreach.node if isinstance(self.foreach, RunTimeForeach) else None
