"""What users write: the pydantic models of topologies, agents and models, the safe YAML
reader, the loader from files to specs, and prompt templates.

The bottom layer of the graph package: pure Python and pydantic, no torch, nothing of rclc
but its torch-free policy names (`rclc.policy`); import-linter contracts in pyproject.toml
check it.
"""

import types as _types

from . import predicates as conditions
from .load import LoadedGraph, load_agent, load_graph, load_graph_text, load_model, read_graph
from .models import (
    AgentSpec,
    EdgeSpec,
    GraphSpec,
    InputSpec,
    McpServerSpec,
    ModelSpec,
    NodeSpec,
    ReasoningSpec,
    RoundsSpec,
    RunTimeForeach,
    TransferPolicy,
    json_schema,
)

# every name imported above, the submodules themselves aside (the imports say where each lives);
# `conditions` is the condition language's module, exported on purpose
__all__ = ["conditions"] + sorted(
    name for name, value in vars().items() if not name.startswith("_") and not isinstance(value, _types.ModuleType)
)
