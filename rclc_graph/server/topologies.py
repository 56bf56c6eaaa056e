"""The topologies a server offers (its --topologies directory) and uploaded ones, planned with
the same library calls `rclc-graph run` makes, plus the checks an upload needs.

An uploaded topology is text from the network, so it gets less than a file on the server:
- it never gets trust_code unless the whole server was started with --trust-code;
- it may reference agent and model profiles by bare name only (resolved in the topologies
  directory as for its own files), never by path, so it cannot make the server read files;
- its models must be `embedded` or a source one of the directory's topologies uses, so it
  cannot make the server load arbitrary checkpoints or reach a model hub.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Mapping

from ..errors import ErrorCode, GraphError, PlanError, SpecError
from ..executors import ModelPool
from ..plan import plan_file, validate_file
from ..plan.compile import compile_plan
from ..plan.dag import Plan
from ..render.drawing import sketch_blueprint, sketch_plan, to_svg
from ..run import preflight
from ..spec import load_graph_text, read_graph
from ..spec import safe_yaml
from ..spec.load import DEFAULT_MAX_BYTES
from ..spec import bounded_json
from ..spec.models import GraphSpec, InputSpec
from .errors import ApiError

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class TopologyCatalog:
    """Topology files of one directory, by name (file stem), and plans of uploaded ones."""

    def __init__(self, directory: Path, *, examples_dir: Path | None = None, trust_code: bool = False) -> None:
        self.directory = directory.resolve()
        self.examples_dir = None if examples_dir is None else examples_dir.resolve()
        self.trust_code = trust_code

    def names(self) -> list[str]:
        """Every topology file of the directory (`.yaml`/`.yml`), by stem."""
        found = {path.stem for path in self.directory.iterdir()
                 if path.is_file() and path.suffix in (".yaml", ".yml") and _NAME.match(path.stem)}
        return sorted(found)

    def path(self, name: str) -> Path:
        """The file of topology `name` (404 for anything that is not one of `names()`)."""
        if name in self.names():
            for suffix in (".yaml", ".yml"):
                candidate = self.directory / f"{name}{suffix}"
                if candidate.is_file():
                    return candidate
        raise ApiError(404, ErrorCode.E_NOT_FOUND, f"topology {name!r} is not in {self.directory}",
                       f"one of: {', '.join(self.names()) or '(none)'}; GET /topologies lists them")

    def describe(self, name: str) -> dict[str, Any]:
        """Name, description, inputs (for a form), node and edge counts and example inputs; a
        topology that does not validate is listed with its problems."""
        path = self.path(name)
        entry: dict[str, Any] = {"name": name, "file": path.name}
        try:
            spec = validate_file(path, trust_code=self.trust_code).spec
        except GraphError as error:
            entry.update(valid=False, problems=[problem.to_dict() for problem in error.problems])
            return entry
        entry.update(valid=True, graph=spec.name, description=spec.description, inputs=inputs_of(spec),
                     nodes=len(spec.nodes), edges=len(spec.edges), example_inputs=self._example(name))
        return entry

    def svg(self, name: str) -> str:
        """The topology drawn (declared nodes), as the report draws it."""
        return to_svg(sketch_blueprint(validate_file(self.path(name), trust_code=self.trust_code)))

    def _example(self, name: str) -> dict[str, Any] | None:
        if self.examples_dir is None:
            return None
        path = self.examples_dir / f"{name}.json"
        try:
            data = bounded_json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    # -- planning ------------------------------------------------------------------------------

    def plan_named(self, name: str, inputs: Mapping[str, Any]) -> tuple[Plan, Path]:
        """Plan a directory topology for `inputs` (file and line in every problem)."""
        path = self.path(name)
        return plan_file(path, inputs, trust_code=self.trust_code), path

    def plan_uploaded(self, text: str, inputs: Mapping[str, Any]) -> Plan:
        """Plan an uploaded topology after the checks uploads need (module docstring)."""
        _refuse_profile_paths(text)
        spec = load_graph_text(text, file="<uploaded>", base_dir=self.directory, max_bytes=DEFAULT_MAX_BYTES)
        allowed = self.model_sources()
        for index, model in enumerate(spec.models):
            if model.source != "embedded" and model.source not in allowed:
                raise SpecError.one(
                    "E_UNKNOWN_REF", f"model {model.name!r}: source {model.source!r} is not one this server offers",
                    "use source: embedded, or a model a topology in the server's --topologies directory declares",
                    ("models", index, "source"))
        return compile_plan(spec, inputs, trust_code=self.trust_code)

    def model_sources(self) -> set[str]:
        """The (resolved) model sources the directory's valid topologies declare."""
        sources: set[str] = set()
        for name in self.names():
            try:
                spec = read_graph(self.path(name)).spec
            except GraphError:
                continue
            sources.update(model.source for model in spec.models)
        return sources

    def preflight(self, plan: Plan, pool: ModelPool, topology: Path | None) -> None:
        """What `rclc-graph run` checks before any weights load: trusted code imports, and every
        prompt fits its context (tokenizers only). Problems of a file name its lines."""
        base_dir = self.directory if topology is None else topology.parent
        try:
            preflight(plan, pool, base_dir)
        except GraphError as error:
            if topology is not None:
                raise error.with_locations(read_graph(topology).locate) from None
            raise


def inputs_of(spec: GraphSpec) -> dict[str, dict[str, Any]]:
    """Each declared input as {type, description, default} (a form can be built from it)."""
    result = {}
    for name, declared in spec.inputs.items():
        full = declared if isinstance(declared, InputSpec) else InputSpec(type=declared)
        result[name] = {"type": full.type, "description": full.description, "default": full.default}
    return result


def plan_sketch_svg(plan: Plan) -> str:
    """A compiled plan drawn (every foreach copy and loop round)."""
    return to_svg(sketch_plan(plan))


def _refuse_profile_paths(text: str) -> None:
    data = safe_yaml.parse(text, "<uploaded>", {})
    if not isinstance(data, dict):
        return  # loading reports it with its location
    for kind in ("agents", "models"):
        entries = data.get(kind)
        for index, entry in enumerate(entries if isinstance(entries, list) else []):
            if isinstance(entry, str) and ("/" in entry or "\\" in entry or entry.startswith(".")
                                           or entry.endswith((".yaml", ".yml"))):
                raise PlanError.one(
                    "E_UNKNOWN_REF", f"{kind[:-1]} profile {entry!r} is a path; an uploaded topology may name "
                    "profiles only by name", f"write the profile inline, or name one of the server's {kind}/ files",
                    (kind, index))
