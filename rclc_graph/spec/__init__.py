"""What users write: the pydantic models of topologies, agents and models, the safe YAML
reader, the loader from files to specs, and prompt templates.

The bottom layer of the graph package: pure Python and pydantic, no torch, nothing of rclc
but its torch-free policy names (`rclc.policy`); import-linter contracts in pyproject.toml
check it.
"""

from . import predicates as conditions
from .load import LoadedGraph, load_agent, load_graph, load_graph_text, load_model, read_graph
from .models import (
    AgentSpec,
    EdgeSpec,
    GraphSpec,
    InputSpec,
    ModelSpec,
    NodeSpec,
    ReasoningSpec,
    RoundsSpec,
    RunTimeForeach,
    TransferPolicy,
    json_schema,
)

__all__ = [
    # models of what users write
    "AgentSpec",
    "EdgeSpec",
    "GraphSpec",
    "InputSpec",
    "ModelSpec",
    "NodeSpec",
    "ReasoningSpec",
    "RoundsSpec",
    "RunTimeForeach",
    "TransferPolicy",
    "conditions",
    "json_schema",
    # files to specs
    "LoadedGraph",
    "load_agent",
    "load_graph",
    "load_graph_text",
    "load_model",
    "read_graph",
]
