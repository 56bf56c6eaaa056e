"""Safe YAML reading that remembers where every value came from.

We compose the node tree with PyYAML's SafeLoader and build plain Python values ourselves
instead of calling `safe_load`, because that lets us (a) keep the line and column of every
key and list item, (b) refuse duplicate keys (PyYAML silently keeps the last one) and
(c) refuse every tag outside the plain JSON-like set before anything is constructed.
Mapping keys are taken as written (`on:` stays the string "on", not YAML 1.1's True).
Aliases are expanded with a node budget so a "billion laughs" file fails fast.

Values are read with the YAML 1.2 core schema, not PyYAML's YAML 1.1 one: only `true`/`false`
(any case written the 1.2 way) are booleans, `null`/`~`/empty are null, integers are decimal,
`0o` octal or `0x` hex, floats are decimal with `.inf`/`.nan`; everything else is a string.
So `output: yes` is the string "yes" (refused where a boolean is wanted, never silently true),
`ratio: 1:30` is the string "1:30" (not 90), and `version: 012` is 12, as the docs promise.

Nesting deeper than `MAX_DEPTH` (mappings and lists, aliases expanded) is refused with a
located E_TOO_DEEP before anything recursive runs on it: the events are counted first with
PyYAML's parser, which is iterative. Strings holding a lone surrogate (`"\\ud800"`) are
refused with E_ENCODING: they cannot be written to a UTF-8 record later.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..errors import FieldPath, Location, Problem, SpecError, UsageError

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
MAX_DEPTH = 64  # nesting of mappings and lists; real topologies use fewer than 8

SourceMap = dict[FieldPath, Location]


class _CoreSchemaLoader(yaml.SafeLoader):
    """SafeLoader whose implicit scalar types are the YAML 1.2 core schema's."""


_CoreSchemaLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", list("~nN") + [""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        list("-+.0123456789"),
    ),
):
    _CoreSchemaLoader.add_implicit_resolver(_tag, re.compile(_pattern), _first)


def _core_scalar(tag: str, value: str) -> Any:
    """The Python value of a plain scalar under the YAML 1.2 core schema (ValueError if the
    text does not fit an explicitly given tag, e.g. `!!int abc`)."""
    if tag == "tag:yaml.org,2002:str":
        return value
    if tag == "tag:yaml.org,2002:null":
        if value not in ("", "~", "null", "Null", "NULL"):
            raise UsageError(f"{value!r} is not null")
        return None
    if tag == "tag:yaml.org,2002:bool":
        if value not in ("true", "True", "TRUE", "false", "False", "FALSE"):
            raise UsageError(f"{value!r} is not true or false")
        return value.lower() == "true"
    if tag == "tag:yaml.org,2002:int":
        if value.startswith("0o"):
            return int(value[2:], 8)
        if value.startswith("0x"):
            return int(value[2:], 16)
        return int(value, 10)
    lowered = value.lower().lstrip("+")
    if lowered in (".inf", "-.inf", ".nan"):
        return float(lowered.replace(".", ""))
    return float(value)


_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate (UTF-16 half), which no UTF-8 file can hold.
    A regex scan (C speed) rather than a per-character loop: inputs may be megabytes, and
    ASCII text (the flag CPython keeps on every string) cannot hold one at all."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def location(file: str, mark: Any) -> Location:
    return Location(file, mark.line + 1, mark.column + 1)


class _Builder:
    def __init__(self, file: str, sources: SourceMap, prefix: FieldPath) -> None:
        self.file = file
        self.sources = sources
        self.prefix = prefix
        self.visited = 0

    def fail(self, code: str, message: str, fix: str, path: FieldPath, mark: Any) -> SpecError:
        return SpecError([Problem(code, message, fix, self.prefix + path, location(self.file, mark))])

    def build(self, node: yaml.Node, path: FieldPath, depth: int = 1) -> Any:
        self.visited += 1
        if depth > MAX_DEPTH:  # reached through aliases (the event scan bounded the written nesting)
            raise self.fail(
                "E_TOO_DEEP",
                f"values nested more than {MAX_DEPTH} levels deep after expanding aliases",
                "flatten the structure, or use fewer nested aliases",
                path,
                node.start_mark,
            )
        if self.visited > MAX_NODES:
            raise self.fail(
                "E_YAML_SYNTAX",
                f"more than {MAX_NODES} YAML nodes after expanding aliases",
                "write the values out, or use fewer nested aliases",
                path,
                node.start_mark,
            )
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ:
                raise self.tag_error(node, path)
            items = []
            for index, child in enumerate(node.value):
                self.sources[self.prefix + path + (index,)] = location(self.file, child.start_mark)
                items.append(self.build(child, path + (index,), depth + 1))
            return items
        if node.tag == _TIMESTAMP:
            return node.value  # a date in a description stays the text that was written
        if node.tag not in _PLAIN_SCALARS:
            raise self.tag_error(node, path)
        if has_surrogate(node.value):
            raise self.fail(
                "E_ENCODING",
                "the text holds a lone surrogate (an escape such as \\ud800 that is half of a character)",
                "write the whole character, or remove the escape",
                path,
                node.start_mark,
            )
        try:
            return _core_scalar(node.tag, node.value)
        except ValueError:
            raise self.fail(
                "E_YAML_TAG",
                f"{node.value!r} is not a valid {node.tag.rsplit(':', 1)[-1]}",
                "remove the tag or fix the value",
                path,
                node.start_mark,
            ) from None

    def mapping(self, node: yaml.MappingNode, path: FieldPath, depth: int) -> dict[str, Any]:
        if node.tag != _MAP:
            raise self.tag_error(node, path)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            # the core schema has no merge type: a plain `<<` key is still refused as one
            if key_node.tag == "tag:yaml.org,2002:merge" or (key_node.value == "<<" and key_node.style is None):
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
            if has_surrogate(key):
                raise self.fail(
                    "E_ENCODING", "a key holds a lone surrogate", "write the whole character", path, key_node.start_mark
                )
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
            result[key] = self.build(value_node, path + (key,), depth + 1)
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
        _check_depth(text, file, prefix)
        root = yaml.compose(text, Loader=_CoreSchemaLoader)
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


def _check_depth(text: str, file: str, prefix: FieldPath) -> None:
    """E_TOO_DEEP when mappings and lists nest deeper than MAX_DEPTH, found by counting the
    parser's events (iterative, unlike the composer, which recurses once per level)."""
    depth = 0
    for event in yaml.parse(text, Loader=_CoreSchemaLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError([Problem(
                    "E_TOO_DEEP",
                    f"values nested more than {MAX_DEPTH} levels deep",
                    "flatten the structure; a topology needs only a few levels",
                    prefix,
                    location(file, event.start_mark),
                )])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
