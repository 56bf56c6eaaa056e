"""Nodes: one step of the graph, an agent reading a prompt or a Python function (`call`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveFloat, ValidationInfo, field_validator, model_validator
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


class NodeSpec(SpecBase):
    """One step of the graph: an agent reading a prompt (rendered from the run's inputs) plus
    whatever its senders hand over, or a Python function (`call`) reading the run's inputs
    and its senders' texts.

    `foreach: documents` repeats the node once per item of the list input `documents`
    (nodes `name[0]`, `name[1]`, ...); inside, `{item}` (or the name set by `item`) is that
    item and `{index}` its position. Nodes in a bounded loop also see `{round}` (1-based).
    `interrupt` stops the run for a person (`before` the node runs, or `after` it ran) and
    asks `question`; their answer continues it (docs/graphs.md#human-in-the-loop).
    """

    name: Name
    # `call` is declared before `agent` so that `agent`'s check can see it (pydantic validates in order)
    call: str | None = Field(
        None, description="package.module:callable: a function node instead of an agent (needs trust_code)"
    )
    agent: Name | None = Field(None, validate_default=True, description="the agent that runs this node (or give call)")
    description: str = ""
    prompt: Template = ""
    generate: bool = Field(True, description="false: only read and pass state on (no decoding)")
    output: bool = Field(False, description="true: an answer node of the run")
    foreach: Ident | None = Field(None, description="a list[str] input: one copy of the node per item")
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
        if value is None and call is None and "call" in info.data:
            # type "missing", so the error's path names the absent field (spec/load.py)
            raise PydanticCustomError("missing", "required field 'agent' is missing",
                                      {"fix": "add agent: NAME, or call: package.module:function for a function node"})
        if value is not None and call is not None:
            raise spec_error("E_FIELD", f"node has both agent {value!r} and call {call!r}",
                         "keep agent for a model node, or call for a function node")
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

    @property
    def is_function(self) -> bool:
        """Whether a Python callable runs this node (`call`) instead of an agent."""
        return self.call is not None
