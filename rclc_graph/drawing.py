"""Pictures of a graph: Mermaid text, an inline SVG (for reports) and an offline PNG.

All three start from a `Sketch`: the nodes and edges to draw with their labels, made either
from a validated topology (declared nodes; foreach and loops shown as annotations) or from a
compiled plan (every concrete node). The layout is layered: a node sits one column right of
its furthest sender, loop edges (round r -> r + 1) are ignored for layering so cycles still
lay out, and the nodes of one column are spread vertically in plan order. Deterministic, no
randomness, so two drawings of one graph are identical.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A palette that stays readable on white (Tableau 10, darker variants first).
PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)
MODE_COLOURS = {"state": "#4e79a7", "full": "#b07aa1", "text": "#7f7f7f"}


@dataclass(frozen=True)
class SketchNode:
    name: str
    detail: str = ""  # second line: agent, foreach, "reads only"
    output: bool = False
    generate: bool = True


@dataclass(frozen=True)
class SketchEdge:
    source: str
    target: str
    label: str = ""
    mode: str = "state"
    loop: bool = False  # a declared loop edge (feeds the next round; drawn backwards, not layered)


@dataclass
class Sketch:
    name: str
    nodes: list[SketchNode] = field(default_factory=list)
    edges: list[SketchEdge] = field(default_factory=list)

    def colour(self, node: str) -> str:
        """Each node's colour, by its position in the sketch (the same in every picture)."""
        for index, item in enumerate(self.nodes):
            if item.name == node:
                return PALETTE[index % len(PALETTE)]
        return "#999999"


# -- building sketches -------------------------------------------------------------------------


def sketch_blueprint(blueprint: Any) -> Sketch:
    """Declared nodes and edges of a validated topology (foreach and loop rounds annotated)."""
    spec = blueprint.spec
    nodes = []
    for node in spec.nodes:
        parts = [f"agent {node.agent}"]
        if node.foreach is not None:
            parts.append(f"one per {node.foreach}")
        loop = blueprint.loop_of(node.name)
        if loop is not None:
            parts.append(f"{loop.rounds} rounds")
        if not node.generate:
            parts.append("reads only")
        nodes.append(SketchNode(node.name, ", ".join(parts), output=node.output, generate=node.generate))
    edges = []
    for index, edge in enumerate(spec.edges):
        policy = blueprint.policies[index]
        label = policy.label if edge.rounds is None else f"{policy.label}, next round"
        edges.append(SketchEdge(edge.source, edge.target, label, policy.mode, loop=edge.rounds is not None))
    return Sketch(spec.name, nodes, edges)


def sketch_plan(plan: Any) -> Sketch:
    """Every concrete node of a compiled plan."""
    nodes = [
        SketchNode(node.name, f"agent {node.agent.name}" + ("" if node.generate else ", reads only"),
                   output=node.output, generate=node.generate)
        for node in plan.nodes
    ]
    # a plan is acyclic (loop rounds are separate nodes), so its round edges lay out like any other
    edges = [SketchEdge(edge.source, edge.target, edge.policy.label, edge.policy.mode) for edge in plan.edges]
    return Sketch(plan.name, nodes, edges)


def sketch_record(record: dict[str, Any]) -> Sketch:
    """A run record's plan, edges labelled with what each hop kept (kept/T)."""
    plan = record["plan"]
    kept = {hop["edge"]: hop for hop in record.get("hops", []) if hop.get("edge") is not None}
    nodes = [
        SketchNode(node["name"], f"agent {node['agent']}" + ("" if node["generate"] else ", reads only"),
                   output=node["output"], generate=node["generate"])
        for node in plan["nodes"]
    ]
    edges = []
    for edge in plan["edges"]:
        label = edge["policy"].get("label", edge["policy"].get("mode", ""))
        hop = kept.get(edge["id"])
        if hop is not None and hop["mode"] != "text":
            label = f"{label}: {hop['kept_positions']}/{hop['total_positions']}"
        edges.append(SketchEdge(edge["source"], edge["target"], label, edge["policy"].get("mode", "state")))
    return Sketch(plan["name"], nodes, edges)


# -- layout ------------------------------------------------------------------------------------


def layout(sketch: Sketch) -> dict[str, tuple[int, float]]:
    """(column, row) per node: column = 1 + the furthest sender's column over non-loop edges;
    rows centred on 0 within a column."""
    senders: dict[str, list[str]] = {node.name: [] for node in sketch.nodes}
    for edge in sketch.edges:
        if not edge.loop and edge.target in senders and edge.source in senders:
            senders[edge.target].append(edge.source)
    column: dict[str, int] = {}

    def depth(name: str, visiting: frozenset[str] = frozenset()) -> int:
        if name in column:
            return column[name]
        if name in visiting:  # an undeclared cycle: draw it anyway
            return 0
        value = 1 + max((depth(source, visiting | {name}) for source in senders[name]), default=-1)
        column[name] = value
        return value

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(sketch.nodes) + 100))
    try:
        for node in sketch.nodes:
            depth(node.name)
    finally:
        sys.setrecursionlimit(limit)
    rows: dict[int, list[str]] = {}
    for node in sketch.nodes:
        rows.setdefault(column[node.name], []).append(node.name)
    positions: dict[str, tuple[int, float]] = {}
    for col, names in rows.items():
        for index, name in enumerate(names):
            positions[name] = (col, index - (len(names) - 1) / 2)
    return positions


# -- Mermaid -----------------------------------------------------------------------------------


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("\n", " ")


def to_mermaid(sketch: Sketch) -> str:
    """Mermaid flowchart text (left to right). Output nodes are rounded and bold, reading-only
    nodes plain boxes, text edges dashed, loop edges dotted."""
    ids = {node.name: f"n{index}" for index, node in enumerate(sketch.nodes)}
    lines = [f"%% {sketch.name}", "flowchart LR"]
    for node in sketch.nodes:
        label = _mermaid_text(node.name if not node.detail else f"{node.name}<br/><small>{node.detail}</small>")
        shape = ('(["', '"])') if node.output else ('["', '"]')
        lines.append(f"    {ids[node.name]}{shape[0]}{label}{shape[1]}")
    for edge in sketch.edges:
        label = _mermaid_text(edge.label)
        source, target = ids[edge.source], ids[edge.target]
        if edge.loop:
            lines.append(f'    {source} -. "{label}" .-> {target}')
        elif edge.mode == "text":
            lines.append(f'    {source} -- "{label}" --> {target}')
        else:
            lines.append(f'    {source} ==>|"{label}"| {target}')
    outputs = [ids[node.name] for node in sketch.nodes if node.output]
    if outputs:
        lines.append("    classDef output stroke-width:3px")
        lines.append(f"    class {','.join(outputs)} output")
    return "\n".join(lines) + "\n"


# -- SVG ---------------------------------------------------------------------------------------

_CHAR = 7.2  # px per character of the 12px sans-serif labels (approximate, for box widths)


def _box_width(node: SketchNode) -> float:
    return max(90.0, _CHAR * max(len(node.name) * 1.1, len(node.detail) * 0.85) + 24)


def to_svg(sketch: Sketch, *, column_gap: float = 70, row_height: float = 74) -> str:
    """A standalone inline SVG (no scripts, no external references); every label escaped."""
    positions = layout(sketch)
    if not sketch.nodes:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>'
    columns = max(col for col, _ in positions.values()) + 1
    widths = [0.0] * columns
    for node in sketch.nodes:
        col = positions[node.name][0]
        widths[col] = max(widths[col], _box_width(node))
    lefts = [20.0]
    for col in range(1, columns):
        lefts.append(lefts[-1] + widths[col - 1] + column_gap)
    low = min(row for _, row in positions.values())
    high = max(row for _, row in positions.values())
    height = (high - low) * row_height + 46 + 60
    width = lefts[-1] + widths[-1] + 20
    boxes: dict[str, tuple[float, float, float, float]] = {}
    for node in sketch.nodes:
        col, row = positions[node.name]
        box_width = _box_width(node)
        x = lefts[col] + (widths[col] - box_width) / 2
        y = 30 + (row - low) * row_height
        boxes[node.name] = (x, y, box_width, 46)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="graph {html.escape(sketch.name)}">',
        "<defs>",
    ]
    for mode, colour in MODE_COLOURS.items():
        parts.append(
            f'<marker id="arrow-{mode}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        )
    parts.append("</defs>")
    for edge in sketch.edges:
        parts.append(_svg_edge(edge, boxes))
    for node in sketch.nodes:
        x, y, w, h = boxes[node.name]
        colour = sketch.colour(node.name)
        stroke = 3 if node.output else 1.5
        dash = "" if node.generate else ' stroke-dasharray="5 3"'
        parts.append(
            f'<g class="node"><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" rx="9" '
            f'fill="{colour}22" stroke="{colour}" stroke-width="{stroke}"{dash}/>'
            f'<text x="{x + w / 2:.1f}" y="{y + 19:.1f}" text-anchor="middle" class="node-name">'
            f"{html.escape(node.name)}</text>"
            f'<text x="{x + w / 2:.1f}" y="{y + 35:.1f}" text-anchor="middle" class="node-detail">'
            f"{html.escape(node.detail)}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _svg_edge(edge: SketchEdge, boxes: dict[str, tuple[float, float, float, float]]) -> str:
    sx, sy, sw, sh = boxes[edge.source]
    tx, ty, tw, th = boxes[edge.target]
    colour = MODE_COLOURS.get(edge.mode, "#4e79a7")
    marker = f'marker-end="url(#arrow-{edge.mode if edge.mode in MODE_COLOURS else "state"})"'
    dash = ' stroke-dasharray="6 4"' if edge.mode == "text" else ""
    if edge.loop or tx <= sx:  # backwards: arc over the top
        x1, y1 = sx + sw / 2, sy
        x2, y2 = tx + tw / 2, ty
        top = min(sy, ty) - 26
        path = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{top:.1f} {x2:.1f},{top:.1f} {x2:.1f},{y2 - 2:.1f}"
        lx, ly = (x1 + x2) / 2, top + 6
        dash = ' stroke-dasharray="2 4"'
    else:
        x1, y1 = sx + sw, sy + sh / 2
        x2, y2 = tx - 2, ty + th / 2
        middle = (x1 + x2) / 2
        path = f"M{x1:.1f},{y1:.1f} C{middle:.1f},{y1:.1f} {middle:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
        lx, ly = middle, (y1 + y2) / 2 - 6
    label = html.escape(edge.label)
    return (
        f'<g class="edge"><path d="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash} {marker}/>'
        f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="middle" class="edge-label">{label}</text></g>'
    )


# -- PNG ---------------------------------------------------------------------------------------


def save_png(sketch: Sketch, path: str | Path, *, dpi: int = 150) -> Path:
    """Draw with matplotlib's Agg canvas (no display, no network, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    positions = layout(sketch)
    columns = max((col for col, _ in positions.values()), default=0) + 1
    rows = [row for _, row in positions.values()] or [0.0]
    span = max(rows) - min(rows) + 1
    figure = Figure(figsize=(max(4.0, 2.6 * columns), max(2.2, 1.1 * span + 0.8)))
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0, 0, 1, 0.92))
    axes.set_axis_off()
    axes.set_xlim(-0.7, columns - 0.3)
    axes.set_ylim(min(rows) - 0.8, max(rows) + 0.8)
    axes.invert_yaxis()
    figure.suptitle(sketch.name, fontsize=11)
    half_width, half_height = 0.38, 0.28
    for edge in sketch.edges:
        (x1, y1), (x2, y2) = positions[edge.source], positions[edge.target]
        backwards = edge.loop or x2 <= x1
        start = (x1 + (0 if backwards else half_width), y1 - (half_height if backwards else 0))
        end = (x2 - (0 if backwards else half_width), y2 - (half_height if backwards else 0))
        style = "dotted" if backwards else ("dashed" if edge.mode == "text" else "solid")
        arrow = FancyArrowPatch(
            start, end, arrowstyle="-|>", mutation_scale=14, linewidth=1.6, linestyle=style,
            color=MODE_COLOURS.get(edge.mode, "#4e79a7"),
            connectionstyle="arc3,rad=0.45" if backwards else "arc3,rad=0.0",
        )
        axes.add_patch(arrow)
        lx, ly = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2 - (0.45 if backwards else 0.08)
        axes.text(lx, ly, edge.label, ha="center", va="bottom", fontsize=7, color="#333333")
    for node in sketch.nodes:
        x, y = positions[node.name]
        colour = sketch.colour(node.name)
        box = FancyBboxPatch(
            (x - half_width, y - half_height), 2 * half_width, 2 * half_height,
            boxstyle="round,pad=0.02,rounding_size=0.08", facecolor=colour + "22", edgecolor=colour,
            linewidth=2.6 if node.output else 1.2, linestyle="solid" if node.generate else "dashed",
        )
        axes.add_patch(box)
        axes.text(x, y - 0.06, node.name, ha="center", va="center", fontsize=9, fontweight="bold")
        axes.text(x, y + 0.13, node.detail, ha="center", va="center", fontsize=6, color="#444444")
    destination = Path(path)
    figure.savefig(destination, dpi=dpi, format="png")
    return destination

