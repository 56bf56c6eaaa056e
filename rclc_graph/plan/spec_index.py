"""A spec's declarations by name and each edge's resolved policy, built once by `validate` and
read by the whole-graph checks of validate.py and agent_features.py (instead of the same six
arguments passed to each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..spec.models import AgentSpec, GraphSpec, ModelSpec, NodeSpec
from .policy import ResolvedPolicy


@dataclass(frozen=True)
class SpecIndex:
    """`spec`'s models, agents and nodes by name, its edges' policies with defaults filled in
    (in edge order), and whether the caller trusts the code the spec names."""

    spec: GraphSpec
    models: Mapping[str, ModelSpec]
    agents: Mapping[str, AgentSpec]
    nodes: Mapping[str, NodeSpec]
    policies: tuple[ResolvedPolicy, ...]
    trust_code: bool
