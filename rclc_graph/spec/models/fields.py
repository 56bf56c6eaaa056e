"""What every spec model shares: the strict frozen base, the error our checks raise (its
stable code travels as the pydantic error type), the checked string types (names, template
variables, templates) and the limits other layers read (node text size, reserved variables).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema
from pydantic_core import PydanticCustomError

from .. import templates

SCHEMA_VERSION = 1
RESERVED_VARIABLES = ("index", "round")  # node variables the plan provides
ANSWER_VARIABLE = "answer"  # the human's answer, a variable of nodes with `interrupt: before`
MAX_NODE_TEXT_BYTES = 1 << 20  # UTF-8 bytes of one node's output, and of one answer (records, events, reports)
DEFAULT_FUNCTION_TIMEOUT = 300.0  # seconds a function node's call may take unless its `timeout` says otherwise

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,99}$")  # at most 100 characters: names become file names
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_CALLABLE_REF = re.compile(rf"^{_DOTTED}:{_DOTTED}$")


def spec_error(code: str, message: str, fix: str) -> PydanticCustomError:
    # Our stable code travels as the pydantic error type; load.py maps it back to a Problem.
    return PydanticCustomError(code, message, {"fix": fix})


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        shown = value if len(value) <= 40 else f"{value[:37]}..."
        raise spec_error(
            "E_FIELD",
            f"name {shown!r} is not allowed" + (f" ({len(value)} characters)" if len(value) > 100 else ""),
            "use at most 100 letters, digits, '_' and '-', starting with a letter or '_' (brackets and '@' are "
            "reserved for expanded nodes such as worker[0] and a@2)",
        )
    return value


def _check_ident(value: str) -> str:
    if not _IDENT.match(value):
        raise spec_error(
            "E_FIELD",
            f"{value!r} is not usable as a template variable",
            "use letters, digits and '_', starting with a letter or '_'",
        )
    return value


def _check_template(value: str) -> str:
    try:
        templates.fields(value)
    except ValueError as exc:
        raise spec_error("E_TEMPLATE", str(exc), "fix the braces; literal braces are written {{ and }}") from None
    return value


def is_name(value: str) -> bool:
    """Whether `value` is usable as a name (of a model, agent, node, MCP server, ...)."""
    return bool(_NAME.match(value))


def is_callable_ref(value: str) -> bool:
    """True for "package.module:function" references (user code; needs trust_code)."""
    return bool(_CALLABLE_REF.match(value))


def tool_name(reference: str) -> str:
    """The name a model calls a tool by: its function's own name ("shop:orders.lookup" -> "lookup")."""
    return reference.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


Name = Annotated[str, AfterValidator(_check_name), WithJsonSchema({"type": "string", "pattern": _NAME.pattern})]
Ident = Annotated[str, AfterValidator(_check_ident), WithJsonSchema({"type": "string", "pattern": _IDENT.pattern})]
Template = Annotated[str, AfterValidator(_check_template)]
InputType = Literal["str", "list[str]"]
OptionValue = Union[bool, int, float, str]


def builtin_or_callable(value: str, what: str, builtins: tuple[str, ...]) -> str:
    """`value` when it names a built-in or a package.module:callable, else E_FIELD."""
    if value not in builtins and not is_callable_ref(value):
        raise spec_error(
            "E_FIELD",
            f"{what} {value!r} is unknown",
            f"use one of {', '.join(builtins)} or package.module:callable",
        )
    return value


class SpecBase(BaseModel):
    # allow_inf_nan=False: `temperature: .inf` is refused here, not after the model loaded
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


def changed_fields(spec: BaseModel, names: tuple[str, ...]) -> list[str]:
    """The fields of `names` whose value is not their default. (Not `model_fields_set`: a
    record's spec is dumped with every default written out and must validate again.)"""
    fields = type(spec).model_fields
    return [name for name in names if getattr(spec, name) != fields[name].get_default(call_default_factory=True)]
