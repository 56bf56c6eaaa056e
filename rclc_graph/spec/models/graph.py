"""The whole topology: declared inputs, models, MCP servers, agents, nodes, edges, named
policies and the plan-size guards; and the JSON Schema of the files users write."""

from __future__ import annotations

import copy
from typing import Annotated, Any, Iterator, Literal, Union

from pydantic import Discriminator, Field, PositiveInt, Tag, field_validator, model_validator

from ...errors import UsageError
from .agent import AgentSpec
from .edge import EdgeSpec, TransferPolicy
from .fields import RESERVED_VARIABLES, SCHEMA_VERSION, Ident, InputType, Name, SpecBase, spec_error
from .mcp import McpServerSpec
from .model import ModelSpec
from .node import NodeSpec


class InputSpec(SpecBase):
    """A declared run input: `str` or `list[str]`, optionally with a default."""

    type: InputType = "str"
    default: str | list[str] | None = None
    description: str = ""

    @model_validator(mode="after")
    def _default_matches(self) -> InputSpec:
        if self.default is None:
            return self
        is_list = isinstance(self.default, list)
        if is_list != (self.type == "list[str]"):
            raise spec_error(
                "E_FIELD",
                f"default is a {'list' if is_list else 'string'} but type is {self.type}",
                "make the default match the type",
            )
        return self


InputRef = Annotated[
    Union[Annotated[InputSpec, Tag("full")], Annotated[InputType, Tag("short")]],
    Discriminator(lambda value: "short" if isinstance(value, str) else "full"),
]


MAX_ROUNDS_LIMIT = 1024  # the most a file may raise rounds.limit to
MAX_NODES_LIMIT = 65_536  # ... and rounds.max_nodes to: no file can ask for an unbounded plan


class RoundsSpec(SpecBase):
    """Guards on plan size: loops and foreach expansion are unrolled before a run starts.

    A file may lower them, and raise them only up to hard caps (plan/size.py checks the size
    arithmetically before anything is unrolled)."""

    limit: PositiveInt = Field(32, le=MAX_ROUNDS_LIMIT, description="the most rounds any loop edge may declare")
    max_nodes: PositiveInt = Field(4096, le=MAX_NODES_LIMIT, description="the most nodes a compiled plan may hold")


class GraphSpec(SpecBase):
    """A whole topology: declared inputs, models, MCP servers, agents, nodes, edges and named policies."""

    version: Literal[1] = SCHEMA_VERSION
    name: Name
    description: str = ""
    inputs: dict[Ident, InputRef] = Field(
        default_factory=dict, description="run inputs; `question: str` is short for `question: {type: str}`"
    )
    models: list[ModelSpec] = Field(default_factory=list)
    mcp_servers: dict[Name, McpServerSpec] = Field(
        default_factory=dict, description="MCP servers agents call tools of (tools: [mcp:<name>])"
    )
    agents: list[AgentSpec] = Field(default_factory=list)
    nodes: list[NodeSpec] = Field(default_factory=list)
    edges: list[EdgeSpec] = Field(default_factory=list)
    policies: dict[Name, TransferPolicy] = Field(default_factory=dict, description="named edge policies")
    rounds: RoundsSpec = Field(default_factory=RoundsSpec)

    @field_validator("inputs")
    @classmethod
    def _normalise_inputs(cls, value: dict[str, Any]) -> dict[str, InputSpec]:
        for key in value:
            if key in RESERVED_VARIABLES:
                raise spec_error("E_FIELD", f"input {key!r} is a reserved variable", "rename the input")
        return {key: InputSpec(type=spec) if isinstance(spec, str) else spec for key, spec in value.items()}

    def input_specs(self) -> dict[str, InputSpec]:
        """Each declared input as an InputSpec (short forms like `question: str` expanded)."""
        return dict(self.inputs)  # type: ignore[arg-type]  # normalised by _normalise_inputs

    def topologies(self, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], GraphSpec]]:
        """(field path, topology) for this topology and every subgraph inside it, depth first:
        `((), self)`, then `(("nodes", 2, "graph"), <the subgraph of nodes[2]>)`, ..."""
        yield path, self
        for index, node in enumerate(self.nodes):
            if isinstance(node.graph, GraphSpec):
                yield from node.graph.topologies(path + ("nodes", index, "graph"))


NodeSpec.model_rebuild(_types_namespace={"GraphSpec": GraphSpec})  # a node's `graph` may hold a whole topology
GraphSpec.model_rebuild()


def json_schema(kind: Literal["topology", "agent", "model"] = "topology") -> dict[str, Any]:
    """JSON Schema of a topology file (or an agent/model profile file), for editors.

    Files differ from the in-memory spec in two ways the schema allows: `agents` and `models`
    entries may be a string naming a profile file, and a profile file may omit `name` (it
    defaults to the file's stem).
    """
    if kind == "topology":
        schema = GraphSpec.model_json_schema()
        if "$ref" in schema:  # recursive (a node's `graph` holds a topology): the root is a definition
            definitions = schema["$defs"]
            schema = {**definitions[schema["$ref"].rsplit("/", 1)[-1]], "$defs": definitions}
            body = definitions["GraphSpec"]
        else:
            body = schema
        for field, ref in (("agents", "AgentSpec"), ("models", "ModelSpec")):
            body["properties"][field]["items"] = schema["properties"][field]["items"] = {
                "anyOf": [{"$ref": f"#/$defs/{ref}"}, {"type": "string", "description": "profile name or path"}]
            }
        title = "rclc-graph topology"
    elif kind in ("agent", "model"):
        model = AgentSpec if kind == "agent" else ModelSpec
        schema = copy.deepcopy(model.model_json_schema())
        schema["required"] = [name for name in schema.get("required", []) if name != "name"]
        title = f"rclc-graph {kind} profile"
    else:
        raise UsageError(f"kind: expected 'topology', 'agent' or 'model', got {kind!r}")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": title}
