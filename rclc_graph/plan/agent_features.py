"""Whole-graph checks of two agent features: tool-calling agents and API-served models.

Kept apart from validate.py's general checks so each feature's rules read in one place:

- `tools` name code (module:callable), so a topology that lists them needs trust_code, as
  custom selectors do; and a tool-calling agent must generate (its loop is generation).
  `mcp:<server>` must name a server declared under `mcp_servers`; a server run as a command
  is code as well (trust_code), one reached at a loopback `url` is not.
- An agent on a `backend: openai` model has no rclc state: nothing can be selected from or
  handed to it except text. So every edge that touches one of its nodes must be `text`, it
  must generate, and local-model options (tools, context_limit) do not apply to it.

Pure: no model, no import of the named code (preflight imports tools before a run).
"""

from __future__ import annotations

from typing import Mapping

from ..errors import Problem
from ..spec.models import AgentSpec, GraphSpec, ModelSpec, NodeSpec, mcp_server_name
from .spec_index import SpecIndex


def check_agent_features(index: SpecIndex) -> list[Problem]:
    """Every problem of tools and API models in the indexed spec (names already resolve)."""
    spec, models, agents, nodes, policies, trust_code = (
        index.spec, index.models, index.agents, index.nodes, index.policies, index.trust_code
    )
    problems: list[Problem] = []
    api_agents = {name for name, agent in agents.items() if models[agent.model].is_api}
    for index, agent in enumerate(spec.agents):
        problems += _tool_problems(spec, index, agent, trust_code)
        if agent.name in api_agents:
            for field_name, present in (("tools", bool(agent.tools)), ("context_limit", agent.context_limit is not None)):
                if present:
                    problems.append(Problem(
                        "E_API_MODEL",
                        f"agent {agent.name!r} runs on API model {agent.model!r}, which does not use {field_name}",
                        f"remove {field_name}, or put the agent on a local model (backend hf or vllm)",
                        ("agents", index, field_name),
                    ))
    for index, node in enumerate(spec.nodes):
        if node.generate or node.agent is None:  # (a function node: control.py checks its fields)
            continue
        agent = agents[node.agent]
        if node.agent in api_agents:
            problems.append(Problem(
                "E_API_MODEL",
                f"node {node.name} has generate: false, but agent {node.agent!r} runs on an API model, which keeps "
                "no state to pass on",
                "set generate: true, or put the agent on a local model",
                ("nodes", index, "generate"),
            ))
        elif agent.tools:
            problems.append(Problem(
                "E_TOOLS",
                f"node {node.name} has generate: false, but agent {node.agent!r} calls tools, which needs generation",
                "set generate: true, or use an agent without tools",
                ("nodes", index, "generate"),
            ))
    for index, edge in enumerate(spec.edges):
        policy = policies[index]
        if policy.mode == "text":
            continue
        ends = [end for end in (edge.source, edge.target) if nodes[end].agent in api_agents]
        if ends:
            problems.append(Problem(
                "E_API_MODEL",
                f"a {policy.mode} edge {edge.source} -> {edge.target} touches {', '.join(ends)}, whose agent runs on "
                "an API model: API models read and write text only, they hold no rclc state",
                "use mode: text for this edge",
                ("edges", index, "policy"),
            ))
    return problems


def _tool_problems(spec: GraphSpec, index: int, agent: AgentSpec, trust_code: bool) -> list[Problem]:
    """An agent's tool references: MCP servers declared, code only with trust_code."""
    problems: list[Problem] = []
    for position, reference in enumerate(agent.tools):
        path = ("agents", index, "tools", position)
        server = mcp_server_name(reference)
        if server is not None and server not in spec.mcp_servers:
            known = ", ".join(spec.mcp_servers)
            problems.append(Problem(
                "E_UNKNOWN_REF", f"tool {reference!r} names no MCP server declared under mcp_servers",
                f"declare it under mcp_servers (known: {known})" if known else "declare it under mcp_servers", path,
            ))
        elif not trust_code and server is None:
            problems.append(Problem(
                "E_TRUST_CODE", f"tool {reference!r} would import and run code named by the YAML",
                "pass --trust-code (trust_code=True) if you trust this file", path,
            ))
        elif not trust_code and spec.mcp_servers[server].runs_code:
            problems.append(Problem(
                "E_TRUST_CODE",
                f"tool {reference!r}: MCP server {server!r} runs the command {spec.mcp_servers[server].command!r}, "
                "code named by the YAML",
                "pass --trust-code (trust_code=True) if you trust this file", path,
            ))
    return problems


def api_edge(spec: GraphSpec, models: Mapping[str, ModelSpec], agents: Mapping[str, AgentSpec],
             nodes: Mapping[str, NodeSpec], index: int) -> bool:
    """Whether edge `index` touches a node on an API model (its mode problems are reported here)."""
    edge = spec.edges[index]
    ends = (nodes[end].agent for end in (edge.source, edge.target))
    return any(agent is not None and models[agents[agent].model].is_api for agent in ends)
