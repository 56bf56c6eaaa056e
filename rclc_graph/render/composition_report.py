"""The report's composition sections: each subgraph instance with its own nodes and their
lineage nested under it, and each run-time foreach with the copies its list ran or skipped.

Its own module so report.html's main renderer stays one job; it reads the plain record data
(the plan's `subgraphs`, each node's `scope` and `foreach_from`, the nodes' lineage summaries,
`node_status` and `skipped`) and escapes everything.
"""

from __future__ import annotations

import html
from typing import Any, Callable

Colour = Callable[[str], str]


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _bar(counts: dict[str, int], colour: Colour, total: int) -> str:
    total = total or sum(counts.values()) or 1
    parts = "".join(f'<span style="width:{100 * count / total:.2f}%;background:{colour(name)}" '
                    f'title="{_e(name)}: {count}"></span>' for name, count in counts.items() if count)
    text = ", ".join(f"{_e(name)} {count}" for name, count in counts.items())
    return f'<div class="bar">{parts}</div><div class="small">{text}</div>'


def subgraphs_section(record: dict[str, Any], colour: Colour) -> str:
    """Each subgraph instance: what it was given, its nodes with their lineage, what it
    returned; nested instances inside their parents. "" when the run has none."""
    plan = record.get("plan", {})
    scopes = plan.get("subgraphs") or []
    if not scopes:
        return ""
    nodes = plan.get("nodes") or []
    blocks = [_instance(record, scope, nodes, colour) for scope in scopes if "/" not in str(scope.get("name"))]
    explain = ('<p class="note">A subgraph node runs another topology as one node: edges into it reach the '
               "subgraph's entry nodes, its returned node's output (and state) is the node's. Its nodes are plan "
               "nodes named <i>subgraph/node</i>; their lineage counts positions by the node that created them, "
               "inside the subgraph or outside it.</p>")
    return f"<section><h2>Subgraphs</h2>{explain}{''.join(blocks)}</section>"


def _instance(record: dict[str, Any], scope: dict[str, Any], nodes: list[dict[str, Any]], colour: Colour) -> str:
    name = str(scope.get("name"))
    status = record.get("node_status") or {}
    finished = record.get("nodes") or {}
    lineage = record.get("lineage") or {}
    rows = []
    for node in nodes:
        if node.get("scope") != name:
            continue
        node_name = node["name"]
        data = finished.get(node_name)
        summary = lineage.get(node_name) or {}
        mark = " (returned)" if node_name == scope.get("returns") else ""
        if data is None:
            cells = "<td class='n'>–</td><td class='n'>–</td><td class='wide'>–</td>"
        else:
            cells = (f"<td class='n'>{data['positions']}</td><td class='n'>{data['inherited_positions']}</td>"
                     f"<td class='wide'>{_bar(summary.get('by_node', {}), colour, data['positions'])}</td>")
        rows.append(f"<tr><td><span class='dot' style='background:{colour(node_name)}'></span>{_e(node_name)}{mark}"
                    f"</td><td>{_e(status.get(node_name, 'not run'))}</td>{cells}</tr>")
    inner = [_instance(record, other, nodes, colour) for other in record.get("plan", {}).get("subgraphs") or []
             if str(other.get("name")).startswith(name + "/") and str(other.get("name")).count("/") == name.count("/") + 1]
    inputs = ", ".join(f"{_e(key)} = {_e(_short(value))}" for key, value in (scope.get("inputs") or {}).items())
    head = ("<tr><th>node</th><th>status</th><th>positions</th><th>inherited</th><th>positions by origin node</th></tr>")
    table = f"<table>{head}{''.join(rows)}</table>" if rows else ""
    return (
        f'<details open class="subgraph"><summary><b>{_e(name)}</b>: subgraph {_e(scope.get("graph"))} '
        f'(node {_e(scope.get("node"))})</summary><p class="small">inputs: {inputs or "none"}; edges in reach '
        f'{_e(", ".join(scope.get("entries") or []))}; returns {_e(scope.get("returns"))}</p>{table}'
        f'<div class="nested">{"".join(inner)}</div></details>'
    )


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def runtime_foreach_section(record: dict[str, Any]) -> str:
    """Each run-time foreach: the node whose list it ranged over and what each copy did. "" when none."""
    nodes = record.get("plan", {}).get("nodes") or []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for node in nodes:
        if node.get("foreach_from"):
            groups.setdefault((str(node["declared"]), str(node["foreach_from"])), []).append(node)
    if not groups:
        return ""
    status = record.get("node_status") or {}
    skipped = record.get("skipped") or {}
    rows = []
    for (declared, producer), copies in groups.items():
        ran = [node["name"] for node in copies if status.get(node["name"]) == "finished"]
        left = [f"{_e(node['name'])} ({_e(skipped[node['name']])})" for node in copies if node["name"] in skipped]
        rows.append(f"<tr><td>{_e(declared)}</td><td>{_e(producer)}</td><td class='n'>{len(copies)}</td>"
                    f"<td>{_e(', '.join(ran)) or '–'}</td><td>{'; '.join(left) or '–'}</td></tr>")
    head = "<tr><th>node</th><th>list from</th><th>planned copies</th><th>ran</th><th>skipped</th></tr>"
    explain = ('<p class="note">A run-time foreach is planned as max_items copies; copy i runs with item i of the '
               "JSON list its producer wrote, and the copies past the list's end are skipped.</p>")
    return f"<section><h2>Run-time foreach</h2><table>{head}{''.join(rows)}</table>{explain}</section>"
