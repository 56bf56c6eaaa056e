"""Pure derivation from a spec: whole-graph validation (`Blueprint`), bounded-loop unrolling,
resolved edge policies, compilation (compile.py) into a frozen `Plan` (dag.py), and the
Python builder.

No model, no torch, nothing of rclc but its torch-free policy names (`rclc.policy`), no I/O
beyond reading topology files (`validate_file`, `plan_file`); import-linter contracts in
pyproject.toml check it.
"""

from .builder import Graph, Policy, Reasoning, chain_of_agents, debate, fan_out, hierarchical, to_yaml
from .compile import compile_plan, expand
from .dag import Plan, PlanEdge, PlanNode
from .files import plan_file, validate_file
from .policy import ResolvedPolicy, ResolvedReasoning
from .validate import Blueprint, validate

__all__ = [
    # validation and compilation
    "Blueprint",
    "Plan",
    "PlanEdge",
    "PlanNode",
    "compile_plan",
    "expand",
    "plan_file",
    "validate",
    "validate_file",
    # policies
    "ResolvedPolicy",
    "ResolvedReasoning",
    # the builder
    "Graph",
    "Policy",
    "Reasoning",
    "chain_of_agents",
    "debate",
    "fan_out",
    "hierarchical",
    "to_yaml",
]
