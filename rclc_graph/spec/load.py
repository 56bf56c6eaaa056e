"""YAML files -> `GraphSpec`, with the file, line and field path in every error.

A topology file may list agent and model profiles by reference instead of inline:

    agents:
      - worker                 # agents/worker.yaml next to the topology or one directory up
      - ../agents/judge.yaml   # a path (contains '/' or ends in .yaml/.yml): relative to this file
      - name: final            # inline
        model: small

A profile file holds one AgentSpec (or ModelSpec) mapping; `name` defaults to the file's
stem. Model sources that are relative paths are resolved against the file that declares
them. Files are read as UTF-8 (a BOM is accepted), at most `max_bytes` each, with safe YAML
only (see `safe_yaml.py`).

Profile files stay inside the topology's tree: the topology's directory and its parent (where
the default `agents/` and `models/` folders are looked up), symbolic links resolved. A
reference outside it (`agents: ["/etc/shadow"]`, `../../elsewhere.yaml`) is refused with
E_PATH before the file is opened, unless the caller trusts the topology (`trusted=True`; the
CLI's --trust-code).
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError

from ..errors import ErrorCode, FieldPath, GraphError, Location, Problem, SpecError, format_path
from . import safe_yaml as _yaml
from .models import AgentSpec, GraphSpec, ModelSpec

DEFAULT_MAX_BYTES = 1 << 20
_PROFILE_DIRS = {"agents": "agents", "models": "models"}


@dataclass(frozen=True)
class LoadedGraph:
    """A spec plus where each of its values was written, so later errors can cite lines."""

    spec: GraphSpec
    sources: Mapping[FieldPath, Location] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    def locate(self, path: FieldPath) -> Location | None:
        """The location of `path`, or of its nearest written ancestor."""
        return locate(self.sources, path)


def locate(sources: Mapping[FieldPath, Location], path: FieldPath) -> Location | None:
    path = tuple(path)
    while True:
        if path in sources:
            return sources[path]
        if not path:
            return None
        path = path[:-1]


def read_text(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The text of a YAML file, refusing missing, oversized and non-UTF-8 files."""
    file = str(path)
    where = Location(file, 1)
    try:
        size = os.stat(file).st_size
        if not Path(file).is_file():
            raise SpecError.one("E_FILE", "not a regular file", "give the path of a YAML file", location=where)
        if size > max_bytes:
            raise SpecError.one(
                "E_FILE_SIZE",
                f"file is {size} bytes, more than the {max_bytes}-byte limit",
                "split the file (agent profiles can live in agents/*.yaml) or raise max_bytes",
                location=where,
            )
        with open(file, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except GraphError:
        raise
    except FileNotFoundError:
        raise SpecError.one("E_FILE", "file not found", "check the path", location=where) from None
    except OSError as exc:
        raise SpecError.one("E_FILE", f"cannot read file ({exc.strerror or exc})", "check the path and permissions", location=where) from None
    if len(raw) > max_bytes:  # grew while we read it
        raise SpecError.one("E_FILE_SIZE", f"file is more than {max_bytes} bytes", "split the file or raise max_bytes", location=where)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError.one(
            "E_ENCODING",
            f"byte 0x{raw[exc.start]:02x} is not valid UTF-8",
            "save the file as UTF-8",
            location=Location(file, line, column),
        ) from None


def read_graph(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES, trusted: bool = False) -> LoadedGraph:
    """Load a topology file and the profiles it references (`trusted`: profiles may live
    outside the topology's tree)."""
    file = str(path)
    return _load_graph(read_text(file, max_bytes=max_bytes), file, Path(file).resolve().parent, max_bytes, trusted)


def load_graph(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES, trusted: bool = False) -> GraphSpec:
    """The GraphSpec of a topology file (`read_graph` also keeps each value's file and line)."""
    return read_graph(path, max_bytes=max_bytes, trusted=trusted).spec


def load_graph_text(
    text: str,
    *,
    file: str = "<string>",
    base_dir: str | os.PathLike[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    trusted: bool = False,
) -> GraphSpec:
    """Load a topology from a string; profile references and relative model paths need `base_dir`."""
    return _load_graph(text, file, None if base_dir is None else Path(base_dir).resolve(), max_bytes, trusted).spec


def load_agent(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> AgentSpec:
    """An agent profile file (agents/*.yaml); `name` defaults to the file's stem."""
    return _load_profile(AgentSpec, path, max_bytes)


def load_model(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> ModelSpec:
    """A model profile file (models/*.yaml); a relative source resolves against the file."""
    return _load_profile(ModelSpec, path, max_bytes)


# -- internals -------------------------------------------------------------------------------


@dataclass
class _Reading:
    """One topology being read with everything it pulls in: where each value was written, the
    files read, the topology's tree (profiles and subgraph files stay inside it unless
    trusted) and the subgraph files being read now (a file among them again is a cycle)."""

    sources: _yaml.SourceMap
    files: list[str]
    root: Path | None
    max_bytes: int
    trusted: bool
    stack: list[Path] = field(default_factory=list)


def _load_graph(text: str, file: str, base_dir: Path | None, max_bytes: int, trusted: bool = False) -> LoadedGraph:
    sources: _yaml.SourceMap = {}
    data = _yaml.parse(text, file, sources)
    _require_mapping(data, file, "a topology")
    reading = _Reading(sources, [file], None if base_dir is None else base_dir.parent, max_bytes, trusted)
    if base_dir is not None and file != "<string>":
        reading.stack.append(Path(file).resolve())
    _resolve_references(data, (), base_dir, reading)
    spec = _validate(GraphSpec, data, sources)
    return LoadedGraph(spec, dict(sources), tuple(reading.files))


def _resolve_references(data: dict[str, Any], path: FieldPath, base_dir: Path | None, reading: _Reading) -> None:
    """Replace profile references and subgraph files in a topology mapping (at `path` inside
    the file being loaded) by what they hold, relative to `base_dir`."""
    for kind in ("agents", "models"):
        entries = data.get(kind)
        if not isinstance(entries, list):
            continue
        for index, entry in enumerate(entries):
            if isinstance(entry, str):
                entries[index] = _read_profile(kind, entry, path + (kind, index), reading.sources, base_dir,
                                               reading.max_bytes, reading.files, reading.trusted, reading.root)
            elif kind == "models" and isinstance(entry, dict):
                _resolve_source(entry, base_dir)
    nodes = data.get("nodes")
    for index, node in enumerate(nodes if isinstance(nodes, list) else []):
        if not isinstance(node, dict):
            continue
        where = path + ("nodes", index, "graph")
        if isinstance(node.get("graph"), str):
            node["graph"] = _read_subgraph(node["graph"], where, base_dir, reading)
        elif isinstance(node.get("graph"), dict):
            _resolve_references(node["graph"], where, base_dir, reading)


MAX_SUBGRAPH_DEPTH = 8  # subgraph files within subgraph files, at most


def _read_subgraph(ref: str, path: FieldPath, base_dir: Path | None, reading: _Reading) -> dict[str, Any]:
    """A subgraph node's topology file as a mapping, its own references resolved against its
    own directory; E_SUBGRAPH for a file already being read (topologies that run each other)."""
    where = reading.sources.get(path)
    shown = ref if len(ref) <= 80 else ref[:77] + "..."
    if base_dir is None:
        raise SpecError.one("E_UNKNOWN_REF", f"subgraph {shown!r} is a file reference but the topology has no directory",
                            "load the topology from a file, pass base_dir, or write the subgraph inline", path, where)
    candidate = base_dir / os.path.expanduser(ref)
    resolved = candidate.resolve()
    if not reading.trusted and reading.root is not None and not resolved.is_relative_to(reading.root):
        raise SpecError.one("E_PATH", f"subgraph {shown!r} lies outside the topology's tree ({reading.root})",
                            f"move the file under {reading.root}, or pass --trust-code (trusted=True) if you trust "
                            "this topology", path, where)
    if resolved in reading.stack:
        chain = " -> ".join(item.name for item in reading.stack[reading.stack.index(resolved):] + [resolved])
        raise SpecError.one("E_SUBGRAPH", f"topology files run each other as subgraphs ({chain})",
                            "a topology cannot contain itself; remove the subgraph node that closes the cycle",
                            path, where)
    if len(reading.stack) > MAX_SUBGRAPH_DEPTH:
        raise SpecError.one("E_SUBGRAPH", f"subgraphs are nested more than {MAX_SUBGRAPH_DEPTH} files deep",
                            "flatten some subgraphs into their parent topology", path, where)
    if not candidate.is_file():
        raise SpecError.one("E_UNKNOWN_REF", f"subgraph file {shown!r} not found (looked at {candidate})",
                            "create the file or fix the path (it is relative to the file that names it)", path, where)
    child = str(candidate)
    reading.files.append(child)
    data = _yaml.parse(read_text(child, max_bytes=reading.max_bytes), child, reading.sources, path)
    reading.sources[path] = Location(child, 1)
    _require_mapping(data, child, "a topology", path)
    reading.stack.append(resolved)
    try:
        _resolve_references(data, path, candidate.resolve().parent, reading)
    finally:
        reading.stack.pop()
    return data


def _require_mapping(data: Any, file: str, what: str, path: FieldPath = ()) -> None:
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a {type(data).__name__}"
        raise SpecError.one(
            "E_FIELD", f"expected {what} mapping, found {found}", "write `name: ...` and the other fields as a mapping", path, Location(file, 1)
        )


def _profile_candidates(kind: str, ref: str, base_dir: Path) -> list[Path]:
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        return [base_dir / ref]
    folder = _PROFILE_DIRS[kind]
    return [directory / folder / f"{ref}{suffix}" for directory in (base_dir, base_dir.parent) for suffix in (".yaml", ".yml")]


def _read_profile(
    kind: str, ref: str, path: FieldPath, sources: _yaml.SourceMap, base_dir: Path | None, max_bytes: int, files: list[str],
    trusted: bool = False, root: Path | None = None,
) -> dict[str, Any]:
    where = sources.get(path)
    singular = kind[:-1]
    if base_dir is None:
        raise SpecError.one(
            "E_UNKNOWN_REF",
            f"{singular} profile {ref!r} is a file reference but the topology has no directory",
            "load the topology from a file, pass base_dir, or write the profile inline",
            path,
            where,
        )
    candidates = _profile_candidates(kind, ref, base_dir)
    if not trusted:
        root = base_dir.parent if root is None else root
        outside = [candidate for candidate in candidates if not candidate.resolve().is_relative_to(root)]
        if outside:
            shown = ref if len(ref) <= 80 else ref[:77] + "..."
            raise SpecError.one(
                "E_PATH",
                f"{singular} profile {shown!r} lies outside the topology's tree ({root})",
                f"move the profile under {root} (e.g. {root / _PROFILE_DIRS[kind]}), or pass --trust-code "
                "(trusted=True) if you trust this topology",
                path,
                where,
            )
    found = next((candidate for candidate in candidates if candidate.is_file()), None)
    if found is None:
        looked = ", ".join(str(candidate) for candidate in candidates)
        raise SpecError.one(
            "E_UNKNOWN_REF", f"{singular} profile {ref!r} not found (looked in {looked})", "create the file or fix the name", path, where
        )
    profile_file = str(found)
    files.append(profile_file)
    data = _yaml.parse(read_text(profile_file, max_bytes=max_bytes), profile_file, sources, path)
    sources[path] = Location(profile_file, 1)
    _require_mapping(data, profile_file, f"an {singular} profile", path)
    data.setdefault("name", found.stem)
    if kind == "models":
        _resolve_source(data, found.parent)
    return data


def _resolve_source(model: dict[str, Any], base_dir: Path | None) -> None:
    source = model.get("source")
    if base_dir is None or not isinstance(source, str):
        return
    if source.startswith("~"):
        model["source"] = os.path.expanduser(source)
    elif source.startswith(("./", "../")):
        model["source"] = os.path.normpath(base_dir / source)


def _load_profile(model: type[BaseModel], path: str | os.PathLike[str], max_bytes: int):
    file = str(path)
    sources: _yaml.SourceMap = {}
    data = _yaml.parse(read_text(file, max_bytes=max_bytes), file, sources)
    _require_mapping(data, file, f"a {model.__name__}")
    data.setdefault("name", Path(file).stem)
    if model is ModelSpec:
        _resolve_source(data, Path(file).resolve().parent)
    return _validate(model, data, sources)


def _validate(model: type[BaseModel], data: dict[str, Any], sources: _yaml.SourceMap):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from_validation(exc, data, sources, model)) from None


def problems_from_validation(
    exc: ValidationError, data: Any, sources: Mapping[FieldPath, Location], root: type[BaseModel]
) -> list[Problem]:
    """One Problem per pydantic error, with a real data path, a location and a fix."""
    problems = []
    for error in exc.errors():
        path = _data_path(error["loc"], data, error["type"] == "missing")
        # our own checks raise their stable code as the pydantic error type (spec/models/fields.py:spec_error)
        code = ErrorCode(error["type"]) if error["type"] in ErrorCode.__members__ else ErrorCode.E_FIELD
        message, fix = _describe(error, path, root)
        problems.append(Problem(code, message, fix, path, locate(sources, path)))
    return problems


def _data_path(loc: tuple[Any, ...], data: Any, missing: bool) -> FieldPath:
    """pydantic's loc minus its union tags ("inline", "function-after[...]", ...)."""
    path: list[str | int] = []
    current = data
    for position, part in enumerate(loc):
        if isinstance(current, dict) and isinstance(part, str) and part in current:
            path.append(part)
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            path.append(part)
            current = current[part]
        elif missing and position == len(loc) - 1:
            path.append(part)
    return tuple(path)


def _describe(error: Mapping[str, Any], path: FieldPath, root: type[BaseModel]) -> tuple[str, str]:
    kind = error["type"]
    message = error["msg"]
    context = error.get("ctx") or {}
    if "fix" in context:
        return message, str(context["fix"])
    name = path[-1] if path else "field"
    if kind == "missing":
        return f"required field {name!r} is missing", f"add {name}: ..."
    if kind == "extra_forbidden":
        allowed = _fields_at(root, path[:-1])
        close = difflib.get_close_matches(str(name), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"unknown field {name!r}", f"{hint}allowed fields here: {', '.join(allowed)}" if allowed else "remove it"
    got = _short(error.get("input"))
    wanted = _WANTED.get(kind)
    fix = f"write {wanted}" if wanted else f"give {format_path(path) or 'the value'} a value as the message says"
    return f"{message[0].lower()}{message[1:]}, got {got}", fix


_WANTED = {
    "int_type": "a whole number, without quotes",
    "int_from_float": "a whole number",
    "float_type": "a number, without quotes",
    "bool_type": "true or false, without quotes",
    "string_type": "text; quote it if YAML reads it as a number, boolean or null",
    "list_type": "a list (- item lines or [a, b])",
    "dict_type": "a mapping (key: value lines)",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "literal_error": "one of the values the message lists",
    "greater_than": "a larger number",
    "greater_than_equal": "a larger number",
    "less_than_equal": "a smaller number",
}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fields_at(root: type[BaseModel], path: FieldPath) -> list[str]:
    """Field names of the model that sits at `path` (for "did you mean" hints)."""
    candidates: list[Any] = [root]
    for part in path:
        following: list[Any] = []
        for annotation in candidates:
            for option in _unwrap(annotation):
                if isinstance(option, type) and issubclass(option, BaseModel) and isinstance(part, str):
                    if part in option.model_fields:
                        following.append(option.model_fields[part].annotation)
                elif typing.get_origin(option) in (list, dict):
                    args = typing.get_args(option)
                    following.append(args[-1] if args else Any)
        candidates = following
    names: list[str] = []
    for annotation in candidates:
        for option in _unwrap(annotation):
            if isinstance(option, type) and issubclass(option, BaseModel):
                names.extend(option.model_fields)
    return names


def _unwrap(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [item for arg in typing.get_args(annotation) for item in _unwrap(arg)]
    return [annotation]
