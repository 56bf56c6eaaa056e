"""Arms of an experiment: one edge policy applied to every handoff of a topology, or a reference.

On the command line an arm is `NAME=MODE[:key=value,...]`:

    r4=state:ratio=4,selector=cacheback      compressed state, relative budget r4
    b256=state:budget=256                    compressed state, bounded budget of 256 positions
    recent2=state:ratio=2,selector=recent    baseline: the most recent positions
    rand4=state:ratio=4,selector=random,seed=3
    full=full                                the sender's whole state
    text=text                                the sender writes a report the receiver reads
    text64=text:max_new_tokens=64            ... of at most 64 tokens ("same-size text")
    floor=question_only                      the answering agent sees only the question
    single=single_context                    the answering agent reads all documents itself

Keys (each maps to an edge-policy field, see docs/yaml_reference.md):

    ratio, budget                  whole numbers (state only; never both)
    selector                       cacheback | qsnap | chunkkv | recent | random | module:callable
    span                           fixed | sentence | paragraph | line (attention selectors)
    max_span                       whole number: the longest span kept in one piece
    relevance                      a number in [0, 1]: keep spans scoring at least that fraction of the best (0: off)
    exclude                        none | all | reasons joined by '+': template+instruction+known
    exclude_by                     position | span: how instruction/known exclusion passes over spans
    allocation                     per_sender | pooled
    bridge                         whole number: spans of a first scoring put in front of the request (0: off)
    span_size, seed                selector options (span_size for built-ins, seed for random)
    opt.NAME                       any other selector option (true/false, numbers, text)
    representation                 embeddings | token_ids+continuous
    reasoning                      latent_mass | module:callable
    reasoning_steps, reasoning_context, reasoning_budget
    max_new_tokens                 text only: caps the report each sender writes

Arms can also come from YAML:

    arms:
      r4: state:ratio=4,selector=cacheback          # the command-line form
      recent2: {mode: state, ratio: 2, selector: recent}
      floor: question_only

What each arm runs (the topology with the arm's policy on every edge, or a reference graph)
is arm_graphs.py's job.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping

from pydantic import ValidationError

from rclc.policy import DEFAULT_EXCLUSION_REASONS, MODES as POLICY_MODES, BudgetPolicy, policy_label

from ..errors import FieldPath, GraphError, Location, Problem, SpecError
from ..spec import safe_yaml
from ..spec.load import problems_from_validation, read_text
from ..spec.models import TransferPolicy

Kind = Literal["policy", "question_only", "single_context"]
SPECIAL = ("question_only", "single_context")
MODES = POLICY_MODES + SPECIAL
INT_KEYS = ("ratio", "budget", "max_span", "span_size", "seed", "reasoning_steps", "reasoning_budget",
            "max_new_tokens", "bridge")
TEXT_KEYS = ("selector", "span", "exclude_by", "allocation", "representation", "reasoning", "reasoning_context")
FLOAT_KEYS = ("relevance",)
KEYS = ("ratio", "budget", "selector", "span", "max_span", "relevance", "exclude", "exclude_by", "allocation", "bridge", "span_size",
        "seed", "representation", "reasoning", "reasoning_steps", "reasoning_context", "reasoning_budget", "max_new_tokens")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_OPTION = re.compile(r"^opt\.([A-Za-z_][A-Za-z0-9_]*)$")


@dataclass(frozen=True)
class Arm:
    """One arm: a name, what it does (`kind`), and for policy arms the edge policy."""

    name: str
    kind: Kind
    policy: TransferPolicy | None = None
    max_new_tokens: int | None = None  # text arms: cap on each sender's report
    source: str = ""  # as written (command line or YAML), for records

    @property
    def mode(self) -> str:
        return self.policy.mode if self.policy is not None else self.kind

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (policy fields that are set, nothing else)."""
        data: dict[str, Any] = {"name": self.name, "kind": self.kind, "mode": self.mode}
        if self.policy is not None:
            data["policy"] = self.policy.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
            data["policy"]["mode"] = self.policy.mode
        if self.max_new_tokens is not None:
            data["max_new_tokens"] = self.max_new_tokens
        if self.source:
            data["source"] = self.source
        return data

    @property
    def label(self) -> str:
        """Short tag for plots: r4, b256, full, text (`rclc.policy`'s labels), question_only ..."""
        if self.policy is None:
            return self.kind
        if self.policy.mode != "state":
            return policy_label(self.policy.mode)
        return BudgetPolicy.from_options(self.policy.ratio, self.policy.budget).label  # neither: the default r4


# -- parsing ---------------------------------------------------------------------------------


def parse_arm(text: str) -> Arm:
    """`NAME=MODE[:key=value,...]` -> Arm; SpecError names the arm and the field."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep:
        raise _arm_error((), "E_FIELD", f"arm {text!r} has no '='", "write NAME=MODE[:key=value,...], e.g. r4=state:ratio=4")
    _check_name(name)
    mode, _, options = rest.strip().partition(":")
    fields: dict[str, Any] = {}
    if options.strip():
        for item in options.split(","):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value:
                raise _arm_error(("arms", name), "E_FIELD", f"option {item.strip()!r} is not key=value",
                                 "write options as key=value separated by commas, e.g. ratio=4,selector=recent")
            if key in fields:
                raise _arm_error(("arms", name, key), "E_FIELD", f"option {key!r} is given twice", "keep one")
            fields[key] = _from_text(name, key, value)
    return _build_arm(name, mode.strip(), fields, text.strip())


def parse_arms(texts: Iterable[str]) -> list[Arm]:
    arms = [parse_arm(text) for text in texts]
    return _unique(arms, {})


def load_arms(path: str | os.PathLike[str]) -> list[Arm]:
    """Arms from a YAML file with a top-level `arms:` mapping (see the module docstring)."""
    file = str(path)
    sources: safe_yaml.SourceMap = {}
    data = safe_yaml.parse(read_text(file), file, sources)
    where = Location(file, 1)
    if not isinstance(data, dict) or set(data) != {"arms"} or not isinstance(data["arms"], dict) or not data["arms"]:
        raise SpecError.one("E_FIELD", "expected a mapping with one key, `arms:`, holding NAME: POLICY entries",
                            "write `arms:` then lines like `r4: state:ratio=4,selector=cacheback`", location=where)
    arms = []
    for name, entry in data["arms"].items():
        path = ("arms", name)
        try:
            name = str(name)
            _check_name(name)
            if isinstance(entry, str):
                arm = parse_arm(f"{name}={entry}")
            elif isinstance(entry, dict):
                entry = dict(entry)
                mode = entry.pop("mode", "state")
                if not isinstance(mode, str):
                    raise _arm_error(path + ("mode",), "E_FIELD", f"mode must be text, got {mode!r}", f"use one of {', '.join(MODES)}")
                arm = _build_arm(name, mode, _from_mapping(name, entry), json.dumps({"mode": mode, **entry}, sort_keys=True))
            else:
                raise _arm_error(path, "E_FIELD", f"expected a POLICY string or a mapping, got {type(entry).__name__}",
                                 "write `NAME: state:ratio=4` or `NAME: {mode: state, ratio: 4}`")
        except GraphError as exc:
            raise type(exc)(p.at(p.location or _yaml_locate(sources, p.path) or where) for p in exc.problems) from None
        arms.append(arm)
    return _unique(arms, sources)


def _from_text(name: str, key: str, value: str) -> Any:
    """A command-line value as the type its key wants."""
    if _OPTION.match(key):
        return _option_value(value)
    if key == "exclude":
        return _exclude_value(value)
    if key in INT_KEYS:
        if not re.fullmatch(r"[0-9]+", value):
            raise _arm_error(("arms", name, key), "E_FIELD", f"{key} must be a whole number, got {value!r}", f"write {key}=4")
        return int(value)
    if key in FLOAT_KEYS:
        if not re.fullmatch(r"[0-9]*\.?[0-9]+", value):
            raise _arm_error(("arms", name, key), "E_FIELD", f"{key} must be a number, got {value!r}", f"write {key}=0.5")
        return float(value)
    return value


def _exclude_value(value: str) -> list[str]:
    """`none`, `all`, or reasons joined by '+' (commas separate an arm's options). `all` is
    template, instruction and known, what it meant before `duplicate` existed, so the
    documented commands that use it measure what they measured; `duplicate` is named."""
    if value == "none":
        return []
    if value == "all":
        return list(DEFAULT_EXCLUSION_REASONS)
    return [reason.strip() for reason in value.split("+")]


def _option_value(value: str) -> bool | int | float | str:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _from_mapping(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """YAML arm fields -> the flat key form (`selector_options` and `reasoning` mappings unfold)."""
    fields: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "selector_options":
            if not isinstance(value, dict):
                raise _arm_error(("arms", name, key), "E_FIELD", "selector_options must be a mapping", "write selector_options: {span_size: 4}")
            for option, option_value in value.items():
                fields[option if option in ("span_size", "seed") else f"opt.{option}"] = option_value
        elif key == "reasoning" and isinstance(value, dict):
            for sub, sub_value in value.items():
                fields["reasoning" if sub == "method" else f"reasoning_{sub}"] = sub_value
        elif key == "exclude" and isinstance(value, str):
            fields[key] = _exclude_value(value)
        else:
            fields[key] = value
    return fields


def _build_arm(name: str, mode: str, fields: dict[str, Any], source: str) -> Arm:
    if mode not in MODES:
        close = difflib.get_close_matches(mode, MODES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise _arm_error(("arms", name, "mode"), "E_FIELD", f"unknown mode {mode!r}", f"{hint}use one of {', '.join(MODES)}")
    for key in fields:
        if key not in KEYS and not _OPTION.match(key):
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _arm_error(("arms", name, key), "E_FIELD", f"unknown option {key!r}",
                             f"{hint}options: {', '.join(KEYS)}, opt.NAME (other selector options)")
    if mode in SPECIAL:
        if fields:
            raise _arm_error(("arms", name, next(iter(fields))), "E_POLICY", f"{mode} takes no options",
                             f"write {name}={mode}")
        return Arm(name, mode, source=source)  # type: ignore[arg-type]
    for key in INT_KEYS:
        if key in fields and (type(fields[key]) is not int):
            raise _arm_error(("arms", name, key), "E_FIELD", f"{key} must be a whole number, got {fields[key]!r}", f"write {key}: 4")
    for key in TEXT_KEYS:
        if key in fields and not isinstance(fields[key], str):
            raise _arm_error(("arms", name, key), "E_FIELD", f"{key} must be text, got {fields[key]!r}", "quote it")
    max_new_tokens = fields.pop("max_new_tokens", None)
    if max_new_tokens is not None:
        if mode != "text":
            raise _arm_error(("arms", name, "max_new_tokens"), "E_POLICY", f"max_new_tokens caps a text report; mode {mode!r} writes none",
                             "use it with mode text only")
        if max_new_tokens < 1:
            raise _arm_error(("arms", name, "max_new_tokens"), "E_FIELD", "max_new_tokens must be at least 1", "write max_new_tokens=64")
    policy_fields: dict[str, Any] = {"mode": mode}
    options: dict[str, Any] = {}
    reasoning: dict[str, Any] = {}
    for key, value in fields.items():
        option = _OPTION.match(key)
        if option:
            options[option.group(1)] = value
        elif key in ("span_size", "seed"):
            options[key] = value
        elif key == "reasoning":
            reasoning["method"] = value
        elif key.startswith("reasoning_"):
            reasoning[key[len("reasoning_"):]] = value
        else:
            policy_fields[key] = value
    if options:
        policy_fields["selector_options"] = options
    if reasoning:
        policy_fields["reasoning"] = reasoning
    try:
        policy = TransferPolicy.model_validate(policy_fields)
    except ValidationError as exc:  # -> SpecError naming the field as the arm wrote it
        problems = problems_from_validation(exc, policy_fields, {}, TransferPolicy)
        raise SpecError(
            Problem(p.code, f"arm {name!r}: {p.message}", p.fix, ("arms", name) + _user_path(p.path)) for p in problems
        ) from None
    return Arm(name, "policy", policy, max_new_tokens, source)


def _user_path(path: FieldPath) -> FieldPath:
    """The policy field path as the user wrote it (span_size, not selector_options.span_size)."""
    if len(path) == 2 and path[0] == "selector_options":
        return path[1:] if path[1] in ("span_size", "seed") else (f"opt.{path[1]}",)
    if len(path) == 2 and path[0] == "reasoning":
        return ("reasoning",) if path[1] == "method" else (f"reasoning_{path[1]}",)
    return path


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise _arm_error(("arms",), "E_FIELD", f"arm name {name!r} is not allowed",
                         "use letters, digits, '_' and '-', starting with a letter or '_'")


def _unique(arms: list[Arm], sources: Mapping[FieldPath, Location]) -> list[Arm]:
    seen: set[str] = set()
    for arm in arms:
        if arm.name in seen:
            raise SpecError.one("E_DUPLICATE_NAME", f"arm {arm.name!r} is declared twice", "give every arm its own name",
                                ("arms", arm.name), _yaml_locate(sources, ("arms", arm.name)))
        seen.add(arm.name)
    if not arms:
        raise SpecError.one("E_FIELD", "no arms given", "pass --arm NAME=POLICY (or --arms-file), e.g. --arm r4=state:ratio=4")
    return arms


def _yaml_locate(sources: Mapping[FieldPath, Location], path: FieldPath) -> Location | None:
    path = tuple(path)
    while path:
        if path in sources:
            return sources[path]
        path = path[:-1]
    return None


def _arm_error(path: FieldPath, code: str, message: str, fix: str) -> SpecError:
    return SpecError.one(code, message, fix, path)
