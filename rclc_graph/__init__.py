"""rclc_graph: declarative agent graphs whose edges move text, whole state or compressed state.

The public names, nothing else. Everything imported here is pure Python (no torch): planning,
loading and validation must work, and stay fast, without a model.
"""

from .builder import Graph, Policy, Reasoning, chain_of_agents, debate, fan_out, hierarchical, to_yaml
from .errors import GraphError, Location, PlanError, Problem, SpecError
from .events import Event, EventStream, StreamStats
from .lineage import Hop, HopRecord, Lineage, Origin, Segment, compose_hop, receiver_lineage
from .load import LoadedGraph, load_agent, load_graph, load_graph_text, load_model, plan_file, read_graph, validate_file
from .plan import Plan, PlanEdge, PlanNode, compile_plan, expand
from .policy import ResolvedPolicy, ResolvedReasoning
from .pool import LoadedModel, ModelPool, default_pool
from .record import RunRecorder, finished_nodes, read_record, run_recorded, run_recorded_sync
from .results import NodeResult, RunResult
from .resume import ResumeError, ResumePoint, read_resume_point, resume_run, resume_run_sync
from .runtime import LocalExecutor, NodeFailed, RunContext
from .scheduler import run_plan, run_plan_sync
from .spec import (
    AgentSpec,
    EdgeSpec,
    GraphSpec,
    InputSpec,
    ModelSpec,
    NodeSpec,
    ReasoningSpec,
    RoundsSpec,
    TransferPolicy,
    json_schema,
)
from .validate import Blueprint, validate

__all__ = [
    "AgentSpec",
    "Blueprint",
    "EdgeSpec",
    "Event",
    "EventStream",
    "Graph",
    "GraphError",
    "GraphSpec",
    "Hop",
    "HopRecord",
    "InputSpec",
    "Lineage",
    "LoadedGraph",
    "LoadedModel",
    "LocalExecutor",
    "ModelPool",
    "NodeFailed",
    "NodeResult",
    "RunContext",
    "RunRecorder",
    "RunResult",
    "ResumeError",
    "ResumePoint",
    "read_resume_point",
    "resume_run",
    "resume_run_sync",
    "default_pool",
    "run_plan",
    "run_plan_sync",
    "run_recorded",
    "run_recorded_sync",
    "Location",
    "ModelSpec",
    "NodeSpec",
    "Origin",
    "Plan",
    "PlanEdge",
    "PlanError",
    "PlanNode",
    "Policy",
    "Problem",
    "Reasoning",
    "ReasoningSpec",
    "ResolvedPolicy",
    "ResolvedReasoning",
    "RoundsSpec",
    "Segment",
    "SpecError",
    "StreamStats",
    "TransferPolicy",
    "chain_of_agents",
    "compile_plan",
    "compose_hop",
    "debate",
    "expand",
    "fan_out",
    "finished_nodes",
    "hierarchical",
    "json_schema",
    "load_agent",
    "load_graph",
    "load_graph_text",
    "load_model",
    "plan_file",
    "read_graph",
    "read_record",
    "receiver_lineage",
    "to_yaml",
    "validate",
    "validate_file",
]
