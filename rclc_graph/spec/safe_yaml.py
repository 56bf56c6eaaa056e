"""Safe YAML reading that remembers where every value came from.

We compose the node tree with PyYAML's SafeLoader and build plain Python values ourselves
instead of calling `safe_load`, because that lets us (a) keep the line and column of every
key and list item, (b) refuse duplicate keys (PyYAML silently keeps the last one) and
(c) refuse every tag outside the plain JSON-like set before anything is constructed.
Mapping keys are taken as written (`on:` stays the string "on", not YAML 1.1's True).
Aliases are expanded with a node budget so a "billion laughs" file fails fast.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from ..errors import FieldPath, Location, Problem, SpecError

_PLAIN_SCALARS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
MAX_NODES = 50_000  # a 1 MiB topology has far fewer; alias bombs stop here

SourceMap = dict[FieldPath, Location]


def location(file: str, mark: Any) -> Location:
    return Location(file, mark.line + 1, mark.column + 1)


class _Builder:
    def __init__(self, file: str, sources: SourceMap, prefix: FieldPath) -> None:
        self.file = file
        self.sources = sources
        self.prefix = prefix
        self.visited = 0
        self.scalars = SafeConstructor()

    def fail(self, code: str, message: str, fix: str, path: FieldPath, mark: Any) -> SpecError:
        return SpecError([Problem(code, message, fix, self.prefix + path, location(self.file, mark))])

    def build(self, node: yaml.Node, path: FieldPath) -> Any:
        self.visited += 1
        if self.visited > MAX_NODES:
            raise self.fail(
                "E_YAML_SYNTAX",
                f"more than {MAX_NODES} YAML nodes after expanding aliases",
                "write the values out, or use fewer nested aliases",
                path,
                node.start_mark,
            )
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ:
                raise self.tag_error(node, path)
            items = []
            for index, child in enumerate(node.value):
                self.sources[self.prefix + path + (index,)] = location(self.file, child.start_mark)
                items.append(self.build(child, path + (index,)))
            return items
        if node.tag == _TIMESTAMP:
            return node.value  # a date in a description stays the text that was written
        if node.tag not in _PLAIN_SCALARS:
            raise self.tag_error(node, path)
        return self.scalars.construct_object(node, deep=True)

    def mapping(self, node: yaml.MappingNode, path: FieldPath) -> dict[str, Any]:
        if node.tag != _MAP:
            raise self.tag_error(node, path)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise self.fail(
                    "E_YAML_SYNTAX",
                    "merge keys (<<) are not supported",
                    "write the fields out, or use a named policy under `policies:`",
                    path,
                    key_node.start_mark,
                )
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _PLAIN_SCALARS | {_TIMESTAMP}:
                raise self.fail(
                    "E_YAML_SYNTAX", "a mapping key must be a plain scalar", "use a plain name as key", path, key_node.start_mark
                )
            key = key_node.value
            if key in result:
                first = self.sources.get(self.prefix + path + (key,))
                where = f" (first at line {first.line})" if first is not None else ""
                raise self.fail(
                    "E_YAML_DUPLICATE",
                    f"key {key!r} appears twice in one mapping{where}",
                    "keep one of them",
                    path + (key,),
                    key_node.start_mark,
                )
            self.sources[self.prefix + path + (key,)] = location(self.file, key_node.start_mark)
            result[key] = self.build(value_node, path + (key,))
        return result

    def tag_error(self, node: yaml.Node, path: FieldPath) -> SpecError:
        return self.fail(
            "E_YAML_TAG",
            f"YAML tag {node.tag!r} is not allowed",
            "remove the tag; only plain strings, numbers, booleans, null, lists and mappings are read",
            path,
            node.start_mark,
        )


def parse(text: str, file: str, sources: SourceMap, prefix: FieldPath = ()) -> Any:
    """Plain Python values of one YAML document; fills `sources` with path -> location.

    `prefix` is prepended to every recorded path, so a profile file loaded into
    `agents[2]` records `("agents", 2, "model")` while pointing at its own file.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = location(file, mark) if mark is not None else Location(file, 1)
        reason = exc.problem or str(exc)
        raise SpecError(
            [Problem("E_YAML_SYNTAX", f"YAML syntax: {reason}", "check indentation, quotes and ':'", prefix, where)]
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(
            [Problem("E_YAML_SYNTAX", f"YAML syntax: {exc}", "check the file is one YAML document", prefix, Location(file, 1))]
        ) from None
    sources.setdefault(prefix, Location(file, 1))
    if root is None:
        return None
    return _Builder(file, sources, prefix).build(root, ())
