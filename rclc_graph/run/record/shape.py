"""The shape of a run record, checked before anything shows it.

`rclc-graph inspect` and resume read record.json, which anyone can edit. A field of the wrong
type (a hop's `kept_positions: "x"`, `nodes: []`) used to surface as a TypeError or KeyError
traceback deep in the table code. `check_record` walks the fields the views and readers use
and raises one ValueError naming the first wrong field, what it holds and what was expected.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from ...results.lineage import HopRecord, required_fields

Check = Callable[[Any], bool]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _counts(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _whole(v) for k, v in value.items())


_WANTED = {_number: "a number", _whole: "a whole number", _text: "text", _counts: "a mapping of names to counts"}

def _mapping(value: Any) -> bool:
    return isinstance(value, dict)


# A hop row is a HopRecord (results/lineage.py): its fields and their types are checked from the
# class itself, so a field added there is checked here. Fields with a default may be absent.
_BY_ANNOTATION: dict[str, Check] = {
    "str": _text, "int": _whole, "float": _number, "int | None": _optional(_whole), "Mapping[str, int]": _counts,
    "Mapping[str, Any] | None": _optional(_mapping), "str | None": _optional(_text),
}
_WANTED_BY_ANNOTATION = {"int | None": "a whole number or null", "Mapping[str, Any] | None": "a mapping or null",
                         "str | None": "text or null"}
_HOP = {item.name: (_BY_ANNOTATION[str(item.type)], _WANTED_BY_ANNOTATION.get(str(item.type)))
        for item in dataclasses.fields(HopRecord)}
_HOP_REQUIRED = frozenset(required_fields(HopRecord))
_SEGMENT_TYPES = (_text, _text, _whole, _whole, _whole)  # origin, kind, hops, start, length


class _Shape:
    def __init__(self) -> None:
        self.where = "record.json"

    def fail(self, path: str, value: Any, wanted: str) -> ValueError:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        return ValueError(
            f"run_dir: {self.where} field {path} is {shown}, expected {wanted}; the record is damaged "
            "(rclc-graph writes it: restore it, or resume the run to rewrite it)"
        )

    def field(self, data: Mapping[str, Any], key: str, check: Check, path: str, wanted: str | None = None) -> Any:
        value = data.get(key)
        if not check(value):
            raise self.fail(f"{path}{key}", value, wanted or _WANTED.get(check, "another value"))
        return value

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, value, "a mapping")
        return value

    def sequence(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(path, value, "a list")
        return value


def check_record(record: Any) -> None:
    """ValueError naming the first field of `record` that has the wrong type."""
    shape = _Shape()
    record = shape.mapping(record, "(the whole file)")
    for key in ("status", "run_id", "graph"):
        shape.field(record, key, _text, "")
    shape.field(record, "error", _optional(_text), "", "text or null")
    outputs = shape.mapping(record.get("outputs", {}), "outputs")
    for name, text in outputs.items():
        if not isinstance(text, (str, type(None))):
            raise shape.fail(f"outputs.{name}", text, "text")
    for index, name in enumerate(shape.sequence(record.get("unfinished", []), "unfinished")):
        if not isinstance(name, str):
            raise shape.fail(f"unfinished[{index}]", name, "a node name")
    timings = shape.mapping(record.get("timings", {}), "timings")
    shape.field(timings, "seconds", _optional(_number), "timings.", "a number or null")
    for index, hop in enumerate(shape.sequence(record.get("hops", []), "hops")):
        hop = shape.mapping(hop, f"hops[{index}]")
        for key, (check, wanted) in _HOP.items():
            if key in _HOP_REQUIRED or key in hop:
                shape.field(hop, key, check, f"hops[{index}].", wanted)
    for name, node in shape.mapping(record.get("nodes", {}), "nodes").items():
        node = shape.mapping(node, f"nodes.{name}")
        for key in ("positions", "inherited_positions"):
            shape.field(node, key, _whole, f"nodes.{name}.")
        shape.field(node, "text", _optional(_text), f"nodes.{name}.", "text or null")
        lineage = shape.mapping(node.get("lineage"), f"nodes.{name}.lineage")
        for index, segment in enumerate(shape.sequence(lineage.get("segments"), f"nodes.{name}.lineage.segments")):
            if not (isinstance(segment, list) and len(segment) == 5 and all(c(v) for c, v in zip(_SEGMENT_TYPES, segment))):
                raise shape.fail(f"nodes.{name}.lineage.segments[{index}]", segment, "[origin, kind, hops, start, length]")
        summary = shape.mapping(node.get("lineage_summary"), f"nodes.{name}.lineage_summary")
        shape.field(summary, "positions", _whole, f"nodes.{name}.lineage_summary.")
        for key in ("by_node", "by_kind", "by_hops"):
            shape.field(summary, key, _counts, f"nodes.{name}.lineage_summary.")
    for key in ("topology", "inputs", "seeds", "versions"):
        shape.mapping(record.get(key, {}), key)
    if record.get("code") is not None:
        shape.mapping(record["code"], "code")
    for key in ("attempts", "models"):
        for index, item in enumerate(shape.sequence(record.get(key, []), key)):
            shape.mapping(item, f"{key}[{index}]")
    plan = shape.mapping(record.get("plan", {}), "plan")
    for index, node in enumerate(shape.sequence(plan.get("nodes", []), "plan.nodes")):
        node = shape.mapping(node, f"plan.nodes[{index}]")
        shape.field(node, "name", _text, f"plan.nodes[{index}].")
        shape.field(node, "output", lambda value: isinstance(value, bool), f"plan.nodes[{index}].", "true or false")
