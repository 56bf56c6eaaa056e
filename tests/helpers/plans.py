"""Plan variants the executor tests compare against."""

from __future__ import annotations

from dataclasses import replace

from rclc_graph.plan.dag import Plan


def spread_reference(plan: Plan) -> Plan:
    """The plan as a run whose fan-ins' senders sit on other replicas than their receiver
    gives it: pooled allocation that the graph's default chose becomes per-sender budgets
    there (pooling needs every sender's scores in one place; executors/fitting.py), so a
    local run of this plan is what such a spread run must equal. Edges that name their
    allocation are left as they are."""
    edges = tuple(
        replace(edge, policy=replace(edge.policy, allocation="per_sender"))
        if edge.policy.allocation == "pooled" and not edge.policy.allocation_named else edge
        for edge in plan.edges
    )
    return replace(plan, edges=edges)
