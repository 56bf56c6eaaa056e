"""What a user writes: pydantic models of a graph, one module per kind — `model` (models and
their batching), `agent` (agent profiles), `node` (nodes), `edge` (edges and the transfer
policies on them), `graph` (the topology, its inputs and size guards, the JSON Schema), `mcp`
(MCP servers agents call tools of), and `fields` (the base, error and checked string
types they share).

Every model forbids unknown fields (a typo is an error, not a silently ignored key) and is
strict (`ratio: "4"` is refused rather than coerced) and frozen. Checks that need one object
only live here, so YAML and the builder both hit them at once; checks that need the whole
graph (references, cycles, models across edges, template fields) live in `plan/validate.py`.

The closed sets of names (modes, representations, reasoning contexts, backends, built-in
selectors and reasoning methods) are `rclc.policy`'s tuples, the ones the transfer core runs
on, so a spec cannot accept a name the core refuses. `rclc.policy` imports no torch.
"""

from .agent import MAX_TOOL_CALLS, AgentSpec
from .edge import EdgeSpec, PolicyRef, ReasoningSpec, TransferPolicy
from .fields import (
    ANSWER_VARIABLE,
    DEFAULT_FUNCTION_TIMEOUT,
    MAX_NODE_TEXT_BYTES,
    RESERVED_VARIABLES,
    SCHEMA_VERSION,
    Ident,
    InputType,
    Name,
    OptionValue,
    Template,
    is_callable_ref,
    tool_name,
)
from .mcp import MCP_PREFIX, McpServerSpec, mcp_server_name
from .graph import MAX_NODES_LIMIT, MAX_ROUNDS_LIMIT, GraphSpec, InputRef, InputSpec, RoundsSpec, json_schema
from .model import API_BACKEND, MODEL_BACKENDS, BatchingSpec, ModelSpec, source_kind
from .node import DEFAULT_RUNTIME_ITEMS, MAX_RUNTIME_ITEMS, NodeSpec, RunTimeForeach

__all__ = [
    "ANSWER_VARIABLE",
    "API_BACKEND",
    "DEFAULT_FUNCTION_TIMEOUT",
    "DEFAULT_RUNTIME_ITEMS",
    "MAX_NODES_LIMIT",
    "MAX_NODE_TEXT_BYTES",
    "MAX_ROUNDS_LIMIT",
    "MAX_RUNTIME_ITEMS",
    "MAX_TOOL_CALLS",
    "MCP_PREFIX",
    "MODEL_BACKENDS",
    "RESERVED_VARIABLES",
    "SCHEMA_VERSION",
    "AgentSpec",
    "BatchingSpec",
    "EdgeSpec",
    "GraphSpec",
    "Ident",
    "InputRef",
    "InputSpec",
    "InputType",
    "McpServerSpec",
    "ModelSpec",
    "Name",
    "NodeSpec",
    "OptionValue",
    "PolicyRef",
    "ReasoningSpec",
    "RoundsSpec",
    "RunTimeForeach",
    "Template",
    "TransferPolicy",
    "is_callable_ref",
    "json_schema",
    "mcp_server_name",
    "source_kind",
    "tool_name",
]
