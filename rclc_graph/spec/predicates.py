r"""The condition language of `when:` (conditional edges) and `until:` (loops that stop).

A condition is data, never code a file can smuggle in: a mapping with exactly one operator
key, checked by pydantic like every other field, and evaluated here by plain functions of
the text a node produced.

    {contains: billing, ignore_case: true}      the text contains "billing"
    {matches: "^(yes|approved)\\b"}              a regular expression is found in the text
    {equals: APPROVED}                           the text, stripped of surrounding white space
    {json: {path: route, equals: billing}}      the text read as JSON: a field equals a value
    {json: {path: scores.0, in: [1, 2]}}        ... or is one of several values
    {all: [...]}, {any: [...]}, {not: {...}}     combinations
    package.module:callable                      a trusted router (needs trust_code)

A router is user code: the run imports it only with trust_code and calls it with the text;
it answers True/False, a node name, or a list of node names (see `router_fires`). Every
other form is evaluated here; nothing is passed to `eval`.

Regular expressions are RE2 patterns (Google's engine, through the `google-re2` package),
compiled when the spec is validated. RE2 matches in time linear in the text whatever the
pattern: a backtracking engine (Python's `re`) takes exponential time on patterns such as
`(.|..)*\x00` or `(x|xx)*\x00`, and no check of a pattern's shape catches them all (such
patterns passed ours and froze a server). A time limit would not do either: the route a run
takes would then depend on how loaded the machine is. RE2 has no backreferences or
lookarounds, and its `\w`, `\d`, `\s` and `\b` are ASCII (use `\p{L}` for any letter); a
pattern it refuses is refused at validation with the reason. Patterns are capped in length.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Annotated, Any, Iterator, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

import re2

from . import bounded_json
from .safe_yaml import MAX_DEPTH
from ..errors import UsageError

MAX_PATTERN_CHARS = 200  # longer patterns are refused (a condition is a short test, not a parser)
MAX_JSON_CHARS = 1 << 20  # texts longer than this are not read as JSON (they hold no routing field)
OPERATORS = ("contains", "matches", "equals", "json", "all", "any", "not")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_ROUTER = re.compile(rf"^{_DOTTED}:{_DOTTED}$")
_JSON_PATH = re.compile(r"^[^.\s]+(?:\.[^.\s]+)*$")

Scalar = Union[bool, int, float, str]


def _error(message: str, fix: str) -> PydanticCustomError:
    return PydanticCustomError("E_FIELD", message, {"fix": fix})


class _Condition(BaseModel):
    # Operator keys that are Python names (json, all, any, not) are aliases; records and
    # to_yaml dump them under the names users write.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, serialize_by_alias=True)


class Contains(_Condition):
    """The text contains `contains` (a literal substring)."""

    contains: str = Field(min_length=1)
    ignore_case: bool = False


class Matches(_Condition):
    """The regular expression `matches` is found somewhere in the text (RE2's search: linear time)."""

    matches: str = Field(min_length=1, description=f"an RE2 regular expression, at most {MAX_PATTERN_CHARS} characters")
    ignore_case: bool = False

    @field_validator("matches")
    @classmethod
    def _compiles(cls, value: str) -> str:
        check_pattern(value)
        return value


class Equals(_Condition):
    """The text, with surrounding white space removed, equals `equals`."""

    equals: str
    ignore_case: bool = False


class JsonTest(_Condition):
    """A field of the text read as JSON: `path` is dotted (`route`, `result.labels.0`), and
    the field must equal `equals` or be one of `in` (strings, numbers or booleans)."""

    path: str = Field(description="dotted path into the JSON value; digits index lists")
    equals: Scalar | None = None
    in_: list[Scalar] | None = Field(None, alias="in")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not _JSON_PATH.match(value):
            raise _error(f"json path {value!r} is not a dotted path", "write field names joined by dots, e.g. result.route")
        return value

    @model_validator(mode="after")
    def _one_test(self) -> JsonTest:
        if (self.equals is None) == (self.in_ is None):
            raise _error("a json test needs exactly one of equals and in", "write equals: VALUE or in: [VALUES]")
        return self


class Json(_Condition):
    """The text read as JSON passes `json` (see `JsonTest`)."""

    json_: JsonTest = Field(alias="json")


class All(_Condition):
    """Every condition of `all` holds."""

    all_: list[Condition] = Field(alias="all", min_length=1)


class AnyOf(_Condition):
    """At least one condition of `any` holds."""

    any_: list[Condition] = Field(alias="any", min_length=1)


class Not(_Condition):
    """The condition `not` does not hold."""

    not_: Condition = Field(alias="not")


_CLASSES: dict[str, type[_Condition]] = {
    "contains": Contains, "matches": Matches, "equals": Equals, "json": Json, "all": All, "any": AnyOf, "not": Not,
}


def _kind(value: Any) -> str:
    """Which form `value` is: an operator key, "router" for a string, or "invalid"."""
    if isinstance(value, str):
        return "router"
    for key, cls in _CLASSES.items():
        if isinstance(value, cls):
            return key
    if isinstance(value, dict):
        present = [key for key in OPERATORS if key in value]
        if len(present) == 1:
            return present[0]
    return "invalid"


def _refuse(value: Any) -> Any:
    if isinstance(value, dict):
        present = [key for key in OPERATORS if key in value]
        if len(present) > 1:
            raise _error(f"a condition has one operator, found {', '.join(present)}",
                         "combine conditions with all: [...] or any: [...]")
        raise _error(f"a condition needs one of the keys {', '.join(OPERATORS)}; found {', '.join(map(str, value)) or 'none'}",
                     "write e.g. {contains: text}, {matches: regex}, {json: {path: field, equals: value}}")
    raise _error(f"a condition is a mapping or a module:callable router, got {type(value).__name__}",
                 "write e.g. {contains: text}, or package.module:function with trust_code")


def _router(value: str) -> str:
    if not _ROUTER.match(value):
        raise _error(f"{value!r} is neither a condition mapping nor a package.module:callable router",
                     "write e.g. {contains: text}, or package.module:function (needs trust_code)")
    return value


Condition = Annotated[
    Union[
        Annotated[Contains, Tag("contains")],
        Annotated[Matches, Tag("matches")],
        Annotated[Equals, Tag("equals")],
        Annotated[Json, Tag("json")],
        Annotated[All, Tag("all")],
        Annotated[AnyOf, Tag("any")],
        Annotated[Not, Tag("not")],
        Annotated[str, BeforeValidator(_router), WithJsonSchema(
            {"type": "string", "pattern": _ROUTER.pattern,
             "description": "package.module:callable router (needs trust_code)"}), Tag("router")],
        Annotated[Any, BeforeValidator(_refuse), WithJsonSchema({"not": {}}), Tag("invalid")],
    ],
    Discriminator(_kind),
]
"""A `when:`/`until:` value: a condition mapping, or a `package.module:callable` router."""

for _model in (All, AnyOf, Not):
    _model.model_rebuild()


# -- checks ----------------------------------------------------------------------------------


def check_pattern(pattern: str) -> Any:
    """`pattern` compiled by RE2, or E_FIELD naming why it is refused (too long, or not a
    pattern RE2 accepts)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise _error(f"pattern is {len(pattern)} characters, more than {MAX_PATTERN_CHARS}",
                     "use a shorter pattern, or several conditions under all/any")
    try:
        return _compiled(pattern, False)
    except re2.error as error:
        reason = error.args[0].decode("utf-8", "replace") if error.args and isinstance(error.args[0], bytes) else error
        raise _error(f"pattern {pattern!r} is not an RE2 regular expression ({reason})",
                     "fix the pattern; RE2 has no backreferences or lookarounds (docs/yaml_reference.md#conditions)") from None


def routers(condition: Any) -> Iterator[str]:
    """Every `module:callable` a condition names (they need trust_code), nested ones too."""
    if isinstance(condition, str):
        yield condition
    elif isinstance(condition, (All, AnyOf)):
        for inner in condition.all_ if isinstance(condition, All) else condition.any_:
            yield from routers(inner)
    elif isinstance(condition, Not):
        yield from routers(condition.not_)


def describe(condition: Any) -> Any:
    """The condition as the plain data a user writes (records, events, reports)."""
    if isinstance(condition, _Condition):
        return condition.model_dump(mode="json", exclude_defaults=True)
    return condition


# -- evaluation ------------------------------------------------------------------------------


def holds(condition: Any, text: str, routed: Any = None) -> bool:
    """Whether `condition` holds for `text`. Routers are decided by the caller, which imports
    and calls them (with trust_code) and passes `routed(reference) -> bool` here."""
    if isinstance(condition, str):
        if routed is None:
            raise UsageError(f"condition {condition!r} is a router; the caller must decide it (routed=...)")
        return bool(routed(condition))
    if isinstance(condition, Contains):
        return _fold(condition.contains, condition.ignore_case) in _fold(text, condition.ignore_case)
    if isinstance(condition, Matches):
        return _compiled(condition.matches, condition.ignore_case).search(text) is not None
    if isinstance(condition, Equals):
        return _fold(text.strip(), condition.ignore_case) == _fold(condition.equals, condition.ignore_case)
    if isinstance(condition, Json):
        return _json_holds(condition.json_, text)
    if isinstance(condition, All):
        return all(holds(inner, text, routed) for inner in condition.all_)
    if isinstance(condition, AnyOf):
        return any(holds(inner, text, routed) for inner in condition.any_)
    if isinstance(condition, Not):
        return not holds(condition.not_, text, routed)
    raise TypeError(f"condition: expected a condition model or a router reference, got {type(condition).__name__}")


def _fold(text: str, ignore_case: bool) -> str:
    return text.casefold() if ignore_case else text


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str, ignore_case: bool) -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is reported as E_FIELD, not logged to stderr
    options.case_sensitive = not ignore_case
    return re2.compile(pattern, options=options)


def needs_worker(condition: Any) -> bool:
    """Whether deciding `condition` reads the whole text with more than a substring search
    (a regular expression, or JSON parsing): the run decides those off its event loop."""
    if isinstance(condition, (Matches, Json)):
        return True
    if isinstance(condition, (All, AnyOf)):
        return any(needs_worker(inner) for inner in (condition.all_ if isinstance(condition, All) else condition.any_))
    if isinstance(condition, Not):
        return needs_worker(condition.not_)
    return False


def read_json(text: str) -> Any:
    """The JSON value in `text`: the whole text, else the first JSON object or array in it
    (models wrap JSON in prose or code fences). None when there is none."""
    if len(text) > MAX_JSON_CHARS:
        return None
    stripped = text.strip()
    try:  # json, not bounded_json: a model may repeat a key (the last one counts, as before)
        value = json.loads(stripped)
        return value if bounded_json.depth(value) <= MAX_DEPTH else None  # too deep to route on
    except RecursionError:  # nested past the interpreter's limit (a RecursionError killed the run)
        return None
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for start, char in enumerate(stripped):
        if char in "{[":
            try:
                value, _end = decoder.raw_decode(stripped, start)
            except ValueError:
                continue
            except RecursionError:  # nested past the interpreter's limit: not a value to route on
                return None
            return value if bounded_json.depth(value) <= MAX_DEPTH else None
    return None


_MISSING = object()


def json_field(value: Any, path: str) -> Any:
    """The field at dotted `path` of a JSON value (digits index lists), or `_MISSING`."""
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _same(found: Any, wanted: Any) -> bool:
    # JSON true is not 1 and "1" is not 1: compare kinds first (Python's True == 1)
    if isinstance(found, bool) or isinstance(wanted, bool):
        return isinstance(found, bool) and isinstance(wanted, bool) and found == wanted
    if isinstance(found, (int, float)) and isinstance(wanted, (int, float)):
        return found == wanted
    return type(found) is type(wanted) and found == wanted


def _json_holds(test: JsonTest, text: str) -> bool:
    found = json_field(read_json(text), test.path)
    if found is _MISSING:
        return False
    if test.in_ is not None:
        return any(_same(found, wanted) for wanted in test.in_)
    return _same(found, test.equals)


def router_fires(answer: Any, target: str, reference: str) -> bool:
    """What a router's answer means for the edge into `target` (its declared node name):
    True/False as given; a node name: fires when it names the target; a list or tuple of
    names: fires when the target is among them. Anything else is a ValueError naming the router."""
    if isinstance(answer, bool):
        return answer
    if isinstance(answer, str):
        return answer == target
    if isinstance(answer, (list, tuple)) and all(isinstance(item, str) for item in answer):
        return target in answer
    raise UsageError(
        f"router {reference!r} returned {type(answer).__name__} {answer!r}; a router returns True/False, "
        "a node name, or a list of node names"
    )


__all__ = [
    "All",
    "AnyOf",
    "Condition",
    "Contains",
    "Equals",
    "Json",
    "JsonTest",
    "MAX_PATTERN_CHARS",
    "Matches",
    "Not",
    "OPERATORS",
    "check_pattern",
    "describe",
    "holds",
    "read_json",
    "router_fires",
    "routers",
]
