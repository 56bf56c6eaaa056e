"""Plan variants the executor tests compare against."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from rclc_graph.plan.dag import Plan


def spread_reference(plan: Plan) -> Plan:
    """The plan as a run whose fan-ins' senders sit on other replicas than their receiver
    gives it: pooled allocation that the graph's default chose becomes per-sender budgets
    there (pooling needs every sender's scores in one place; executors/fitting.py), so a
    local run of this plan is what such a spread run must equal. Edges that name their
    allocation are left as they are. A bridge the default chose is left out of fan-ins (a
    group of several senders) for the same reason; a lone sender bridges on its own host."""
    inbound = Counter(edge.target for edge in plan.edges if edge.policy.mode != "text")

    def spread(policy, fan_in: bool):
        if policy.allocation == "pooled" and not policy.allocation_named:
            policy = replace(policy, allocation="per_sender")
        if fan_in and policy.bridge and not policy.bridge_named:
            policy = replace(policy, bridge=None)
        return policy

    edges = tuple(replace(edge, policy=spread(edge.policy, inbound[edge.target] > 1)) for edge in plan.edges)
    return replace(plan, edges=edges)
