"""Pure derivation from a spec: whole-graph validation (`Blueprint`), bounded-loop unrolling,
resolved edge policies, compilation (compile.py) into a frozen `Plan` (dag.py), and the
Python builder.

No model, no torch, nothing of rclc but its torch-free policy names (`rclc.policy`), no I/O
beyond reading topology files (`validate_file`, `plan_file`); import-linter contracts in
pyproject.toml check it.
"""

import types as _types

from .builder import Graph, Policy, Reasoning, chain_of_agents, debate, fan_out, hierarchical, to_yaml
from .compile import compile_plan, expand
from .dag import Plan, PlanEdge, PlanNode
from .files import plan_file, validate_file
from .policy import ResolvedPolicy, ResolvedReasoning
from .validate import Blueprint, validate

# every name imported above, the submodules themselves aside (the imports say where each lives)
__all__ = sorted(
    name for name, value in vars().items() if not name.startswith("_") and not isinstance(value, _types.ModuleType)
)
