"""Pictures of a graph: Mermaid text, an inline SVG (for reports) and an offline PNG.

All three start from a `Sketch`: the nodes and edges to draw with their labels, made either
from a validated topology (declared nodes; foreach and loops shown as annotations) or from a
compiled plan (every concrete node). The layout is layered: a node sits one column right of
its furthest sender, loop edges (round r -> r + 1) are ignored for layering so cycles still
lay out, and the nodes of one column are spread vertically in plan order. Deterministic, no
randomness, so two drawings of one graph are identical.

A subgraph's nodes are drawn inside a labelled frame (a Mermaid `subgraph` block), nested as
the subgraphs are; a run-time foreach copy gets a dashed "item" edge from the node whose list
it ranges over.
"""

from __future__ import annotations

import html
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rclc.files import write_atomic


# A palette that stays readable on white (Tableau 10, darker variants first).
PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)
MODE_COLOURS = {"state": "#4e79a7", "full": "#b07aa1", "text": "#7f7f7f"}
SKIPPED_COLOUR = "#c8ccd1"  # nodes that did not run and edges that did not fire


def _node_detail(agent: str | None, call: str | None, generate: bool) -> str:
    if call is not None:
        return f"function {call.rpartition(':')[2]}"
    return f"agent {agent}" + ("" if generate else ", reads only")


def _edge_label(label: str, when: Any, until: Any = None) -> str:
    marks = [word for word, value in (("when", when), ("until", until)) if value is not None]
    return label + "".join(f" · {mark}" for mark in marks)


@dataclass(frozen=True)
class SketchNode:
    name: str
    detail: str = ""  # second line: agent, foreach, "reads only"
    output: bool = False
    generate: bool = True
    skipped: bool = False  # a run's node that did not run (drawn greyed)


@dataclass(frozen=True)
class SketchEdge:
    source: str
    target: str
    label: str = ""
    mode: str = "state"
    loop: bool = False  # a declared loop edge (feeds the next round; drawn backwards, not layered)
    idle: bool = False  # a run's edge that did not fire (drawn greyed)


@dataclass(frozen=True)
class SketchGroup:
    """A subgraph instance: its frame's label and the nodes drawn directly inside it."""

    name: str  # the instance ("research", "a[0]/b"); a group inside another is named under it
    label: str
    members: tuple[str, ...]


@dataclass
class Sketch:
    name: str
    nodes: list[SketchNode] = field(default_factory=list)
    edges: list[SketchEdge] = field(default_factory=list)
    groups: list[SketchGroup] = field(default_factory=list)  # outer groups before the ones inside them

    def colour(self, node: str) -> str:
        """Each node's colour, by its position in the sketch (the same in every picture);
        grey for a node a run skipped."""
        for index, item in enumerate(self.nodes):
            if item.name == node:
                return SKIPPED_COLOUR if item.skipped else PALETTE[index % len(PALETTE)]
        return "#999999"


# -- building sketches -------------------------------------------------------------------------


def sketch_blueprint(blueprint: Any) -> Sketch:
    """Declared nodes and edges of a validated topology (foreach and loop rounds annotated)."""
    spec = blueprint.spec
    nodes = []
    for node in spec.nodes:
        parts = [_node_detail(node.agent, node.call, True)]
        if node.interrupt is not None:
            parts.append(f"asks a person {node.interrupt}")
        if node.is_subgraph:
            parts = [f"subgraph {getattr(node.graph, 'name', node.graph)}"]
        if node.foreach_node is not None:
            parts.append(f"one per item of {node.foreach_node}'s list")
        elif node.foreach is not None:
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
        label = _edge_label(label, edge.when, edge.until)
        edges.append(SketchEdge(edge.source, edge.target, label, policy.mode, loop=edge.rounds is not None))
    edges += [SketchEdge(producer, node, "items", "text") for producer, node in blueprint.dependencies]
    return Sketch(spec.name, nodes, edges)


def sketch_plan(plan: Any) -> Sketch:  # a plan.dag.Plan; Any because render imports no layer (its contract)
    """Every concrete node of a compiled plan."""
    nodes = [
        SketchNode(node.name, _node_detail(None if node.agent is None else node.agent.name, node.call, node.generate),
                   output=node.output, generate=node.generate)
        for node in plan.nodes
    ]
    # a plan is acyclic (loop rounds are separate nodes), so its round edges lay out like any other
    edges = [SketchEdge(edge.source, edge.target, _edge_label(edge.policy.label, edge.when, edge.stop),
                        edge.policy.mode) for edge in plan.edges]
    edges += [SketchEdge(node.foreach_from, node.name, f"item {node.index}", "text")
              for node in plan.nodes if node.foreach_from is not None]
    scopes = [(scope.name, scope.graph) for scope in plan.scopes.values()]
    return Sketch(plan.name, nodes, edges, _groups(scopes, [(node.name, node.scope) for node in plan.nodes]))


def _groups(scopes: list[tuple[str, str]], members: list[tuple[str, str]]) -> list[SketchGroup]:
    """One group per subgraph instance (outer ones first), holding the nodes directly in it."""
    ordered = sorted(scopes, key=lambda item: item[0].count("/"))
    return [SketchGroup(name, f"{name}: subgraph {graph}", tuple(node for node, scope in members if scope == name))
            for name, graph in ordered]


def sketch_record(record: dict[str, Any]) -> Sketch:
    """A run record's plan, edges labelled with what each hop kept (kept/T); nodes the run
    skipped and conditional edges that did not fire are greyed."""
    plan = record["plan"]
    kept = {hop["edge"]: hop for hop in record.get("hops", []) if hop.get("edge") is not None}
    skipped = record.get("skipped") or {}
    fired = record.get("fired") or {}
    nodes = []
    for node in plan["nodes"]:
        detail = _node_detail(node.get("agent"), node.get("call"), node["generate"])
        if node["name"] in skipped:
            detail = "skipped"
        nodes.append(SketchNode(node["name"], detail, output=node["output"], generate=node["generate"],
                                skipped=node["name"] in skipped))
    edges = []
    for edge in plan["edges"]:
        label = _edge_label(edge["policy"].get("label", edge["policy"].get("mode", "")), edge.get("when"),
                            edge.get("stop"))
        hop = kept.get(edge["id"])
        if hop is not None and hop["mode"] != "text":
            label = f"{label}: {hop['kept_positions']}/{hop['total_positions']}"
        # (an edge into a node the run skipped delivered nothing either: a run-time copy past its list's end)
        idle = _decision(fired, edge) is False or edge["source"] in skipped or edge["target"] in skipped
        edges.append(SketchEdge(edge["source"], edge["target"], label, edge["policy"].get("mode", "state"), idle=idle))
    for node in plan["nodes"]:
        if node.get("foreach_from"):
            edges.append(SketchEdge(node["foreach_from"], node["name"], f"item {node.get('index')}", "text",
                                    idle=node["name"] in skipped))
    scopes = [(str(item.get("name")), str(item.get("graph"))) for item in plan.get("subgraphs") or []]
    return Sketch(plan["name"], nodes, edges, _groups(scopes, [(node["name"], node.get("scope") or "")
                                                               for node in plan["nodes"]]))


def _decision(fired: dict[str, Any], edge: dict[str, Any]) -> Any:
    """A conditional edge's recorded decision (None: not conditional, or not decided): keyed
    "source->target" since issue 27, by plan edge id in records written before."""
    key = f"{edge['source']}->{edge['target']}"
    return fired[key] if key in fired else fired.get(str(edge["id"]))


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
    dashed = []  # Mermaid has no dashed arrow: text edges are drawn dashed by linkStyle (as in the SVG)
    for index, edge in enumerate(sketch.edges):
        label = _mermaid_text(edge.label)
        source, target = ids[edge.source], ids[edge.target]
        if edge.loop:
            lines.append(f'    {source} -. "{label}" .-> {target}')
        elif edge.mode == "text":
            lines.append(f'    {source} -- "{label}" --> {target}')
            dashed.append(str(index))
        else:
            lines.append(f'    {source} ==>|"{label}"| {target}')
    lines += _mermaid_groups(sketch, ids)
    if dashed:
        lines.append(f"    linkStyle {','.join(dashed)} stroke-dasharray:6 4")
    outputs = [ids[node.name] for node in sketch.nodes if node.output]
    if outputs:
        lines.append("    classDef output stroke-width:3px")
        lines.append(f"    class {','.join(outputs)} output")
    return "\n".join(lines) + "\n"


def _inside(group: SketchGroup, other: SketchGroup) -> bool:
    return other.name.startswith(group.name + "/")


def _mermaid_groups(sketch: Sketch, ids: dict[str, str]) -> list[str]:
    """`subgraph` blocks, nested as the subgraph instances are, each listing its own nodes."""
    lines: list[str] = []
    index = {group.name: position for position, group in enumerate(sketch.groups)}

    def block(group: SketchGroup, depth: int) -> None:
        pad = "    " * depth
        lines.append(f'{pad}subgraph g{index[group.name]} ["{_mermaid_text(group.label)}"]')
        lines.extend(f"{pad}    {ids[name]}" for name in group.members if name in ids)
        for other in sketch.groups:
            if _inside(group, other) and other.name.count("/") == group.name.count("/") + 1:
                block(other, depth + 1)
        lines.append(f"{pad}end")

    for group in sketch.groups:
        if "/" not in group.name:
            block(group, 1)
    return lines


# -- geometry shared by SVG and PNG ------------------------------------------------------------

_CHAR = 7.2  # px per character of the 12px sans-serif labels (approximate, for box widths)
_BOX_HEIGHT = 46.0


@dataclass(frozen=True)
class Route:
    """One edge as a cubic Bezier (pixels, y down) with its label's anchor."""

    edge: SketchEdge
    points: tuple[tuple[float, float], ...]  # start, control 1, control 2, end
    label_at: tuple[float, float]
    style: str  # solid | dashed | dotted


@dataclass(frozen=True)
class Geometry:
    width: float
    height: float
    boxes: dict[str, tuple[float, float, float, float]]  # x, y, width, height
    routes: list[Route]


def _box_width(node: SketchNode) -> float:
    return max(90.0, _CHAR * max(len(node.name) * 1.1, len(node.detail) * 0.85) + 24)


def geometry(sketch: Sketch, *, column_gap: float = 80, row_height: float = 78) -> Geometry:
    """Boxes in layered columns and one route per edge. Forward edges to the next column are
    S-curves; edges that skip columns bow below the row so they do not cross the boxes in
    between; backward and loop edges arc over the top; self-loops are small arcs above."""
    positions = layout(sketch)
    if not sketch.nodes:
        return Geometry(10, 10, {}, [])
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
    backwards = sum(1 for edge in sketch.edges if edge.loop or edge.source == edge.target
                    or positions[edge.target][0] <= positions[edge.source][0])
    top = 20.0 + (50.0 + 12.0 * min(backwards, 6) if backwards else 0.0)
    boxes: dict[str, tuple[float, float, float, float]] = {}
    for node in sketch.nodes:
        col, row = positions[node.name]
        box_width = _box_width(node)
        boxes[node.name] = (lefts[col] + (widths[col] - box_width) / 2, top + (row - low) * row_height, box_width,
                            _BOX_HEIGHT)
    routes: list[Route] = []
    over = under = 0
    bottom_extra = 0.0
    for edge in sketch.edges:
        sx, sy, sw, sh = boxes[edge.source]
        tx, ty, tw, th = boxes[edge.target]
        scol, tcol = positions[edge.source][0], positions[edge.target][0]
        style = "dashed" if edge.mode == "text" else "solid"
        if edge.source == edge.target:
            x1, x2, y = sx + sw * 0.3, sx + sw * 0.7, sy
            lift = 44 + 12 * over
            over += 1
            points = ((x1, y), (x1 - 10, y - lift), (x2 + 10, y - lift), (x2, y - 2))
            routes.append(Route(edge, points, (sx + sw / 2, y - 0.75 * lift - 4), "dotted"))
        elif edge.loop or tcol <= scol:
            x1, y1, x2, y2 = sx + sw / 2, sy, tx + tw / 2, ty
            lift = 50 + 12 * over
            over += 1
            peak = min(y1, y2) - lift
            points = ((x1, y1), (x1, peak), (x2, peak), (x2, y2 - 2))
            routes.append(Route(edge, points, ((x1 + x2) / 2, min(y1, y2) - 0.75 * lift - 4), "dotted"))
        elif tcol - scol > 1 and any(
            scol < positions[other][0] < tcol and _overlaps(boxes[other], min(sy, ty), max(sy + sh, ty + th))
            for other in boxes
        ):
            x1, y1, x2, y2 = sx + sw / 2, sy + sh, tx + tw / 2, ty + th
            drop = 46 + 12 * under
            under += 1
            floor = max(y1, y2) + drop
            bottom_extra = max(bottom_extra, drop)
            points = ((x1, y1), (x1, floor), (x2, floor), (x2, y2 + 2))
            routes.append(Route(edge, points, ((x1 + x2) / 2, max(y1, y2) + 0.75 * drop + 12), style))
        else:
            x1, y1, x2, y2 = sx + sw, sy + sh / 2, tx - 2, ty + th / 2
            middle = (x1 + x2) / 2
            points = ((x1, y1), (middle, y1), (middle, y2), (x2, y2))
            routes.append(Route(edge, points, (middle, (y1 + y2) / 2 - 7), style))
    height = top + (high - low) * row_height + _BOX_HEIGHT + 24 + bottom_extra
    width = lefts[-1] + widths[-1] + 20
    return Geometry(width, height, boxes, routes)


def _overlaps(box: tuple[float, float, float, float], top: float, bottom: float) -> bool:
    return box[1] < bottom and box[1] + box[3] > top


# -- SVG ---------------------------------------------------------------------------------------

_SVG_STYLE = (
    ".node-name{font:600 13px system-ui,sans-serif;fill:#1f2328}"
    ".node-detail{font:11px system-ui,sans-serif;fill:#59636e}"
    ".edge-label{font:11px system-ui,sans-serif;fill:#1f2328;paint-order:stroke;stroke:#f6f8fa;stroke-width:4px}"
)


def to_svg(sketch: Sketch) -> str:
    """A standalone inline SVG (no scripts, no external references); every label escaped.
    Node groups carry `data-node`, edge groups `data-source`/`data-target`, so a page can
    style them by name (the server's live view colours node states)."""
    shape = geometry(sketch)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {shape.width:.0f} {shape.height:.0f}" '
        f'width="{shape.width:.0f}" height="{shape.height:.0f}" role="img" '
        f'aria-label="graph {html.escape(sketch.name)}">',
        f"<style>{_SVG_STYLE}</style>",
        "<defs>",
    ]
    for mode, colour in MODE_COLOURS.items():
        parts.append(
            f'<marker id="arrow-{mode}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        )
    parts.append("</defs>")
    parts += _svg_frames(sketch, shape)
    dashes = {"solid": "", "dashed": ' stroke-dasharray="6 4"', "dotted": ' stroke-dasharray="2 4"'}
    for route in shape.routes:
        mode = route.edge.mode if route.edge.mode in MODE_COLOURS else "state"
        (x1, y1), (c1x, c1y), (c2x, c2y), (x2, y2) = route.points
        lx, ly = route.label_at
        colour = SKIPPED_COLOUR if route.edge.idle else MODE_COLOURS[mode]
        ends = f'data-source="{html.escape(route.edge.source)}" data-target="{html.escape(route.edge.target)}"'
        parts.append(
            f'<g class="edge" {ends}><path d="M{x1:.1f},{y1:.1f} C{c1x:.1f},{c1y:.1f} {c2x:.1f},{c2y:.1f} {x2:.1f},{y2:.1f}" '
            f'fill="none" stroke="{colour}" stroke-width="2"{dashes[route.style]} '
            f'marker-end="url(#arrow-{mode})"/>'
            f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="middle" class="edge-label">'
            f"{html.escape(route.edge.label)}</text></g>"
        )
    for node in sketch.nodes:
        x, y, w, h = shape.boxes[node.name]
        colour = sketch.colour(node.name)
        stroke = 3 if node.output else 1.5
        dash = "" if node.generate and not node.skipped else ' stroke-dasharray="5 3"'
        opacity = ' opacity="0.55"' if node.skipped else ""
        parts.append(
            f'<g class="node{" skipped" if node.skipped else ""}" data-node="{html.escape(node.name)}"{opacity}>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.0f}" rx="9" '
            f'fill="{colour}22" stroke="{colour}" stroke-width="{stroke}"{dash}/>'
            f'<text x="{x + w / 2:.1f}" y="{y + 19:.1f}" text-anchor="middle" class="node-name">'
            f"{html.escape(node.name)}</text>"
            f'<text x="{x + w / 2:.1f}" y="{y + 35:.1f}" text-anchor="middle" class="node-detail">'
            f"{html.escape(node.detail)}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def frames(sketch: Sketch, shape: Geometry) -> list[tuple[SketchGroup, tuple[float, float, float, float]]]:
    """Each subgraph group's frame (x, y, width, height): around its nodes and the groups in it."""
    found = []
    for group in sketch.groups:
        inner = [other for other in sketch.groups if _inside(group, other)]
        names = set(group.members).union(*(other.members for other in inner))
        boxes = [shape.boxes[name] for name in names if name in shape.boxes]
        if not boxes:
            continue
        depth = max((other.name.count("/") - group.name.count("/") for other in inner), default=0)
        pad = 8.0 + 7.0 * depth
        left, top = min(box[0] for box in boxes) - pad, min(box[1] for box in boxes) - pad - 12
        right = max(box[0] + box[2] for box in boxes) + pad
        bottom = max(box[1] + box[3] for box in boxes) + pad
        found.append((group, (left, top, right - left, bottom - top)))
    return found


def _svg_frames(sketch: Sketch, shape: Geometry) -> list[str]:
    return [
        f'<g class="subgraph" data-scope="{html.escape(group.name)}"><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
        f'height="{h:.1f}" rx="12" fill="none" stroke="#8c959f" stroke-width="1.2" stroke-dasharray="4 3"/>'
        f'<text x="{x + 8:.1f}" y="{y + 12:.1f}" class="node-detail">{html.escape(group.label)}</text></g>'
        for group, (x, y, w, h) in frames(sketch, shape)
    ]


# -- PNG ---------------------------------------------------------------------------------------


def save_png(sketch: Sketch, path: str | Path, *, dpi: int = 150) -> Path:
    """The same picture as the SVG, drawn with matplotlib's Agg canvas (no display, no
    network, no pyplot state)."""
    # lazy: matplotlib is heavy, and only PNGs need it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    from matplotlib.path import Path as CurvePath

    shape = geometry(sketch)
    title = 26.0
    scale = 1 / 96  # pixels -> inches at the SVG's nominal 96 dpi
    figure = Figure(figsize=(shape.width * scale, (shape.height + title) * scale))
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_axis_off()
    axes.set_xlim(0, shape.width)
    axes.set_ylim(shape.height, -title)  # y down, as in the SVG
    axes.text(shape.width / 2, -title / 2, sketch.name, ha="center", va="center", fontsize=11, fontweight="bold")
    styles = {"solid": "solid", "dashed": (0, (5, 3)), "dotted": (0, (1.5, 3))}
    for group, (x, y, w, h) in frames(sketch, shape):
        axes.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=10", facecolor="none",
                                      edgecolor="#8c959f", linewidth=1.0, linestyle=(0, (4, 3))))
        axes.text(x + 8, y + 10, group.label, ha="left", va="center", fontsize=6.5, color="#59636e")
    for route in shape.routes:
        curve = CurvePath(list(route.points), [CurvePath.MOVETO, CurvePath.CURVE4, CurvePath.CURVE4, CurvePath.CURVE4])
        colour = SKIPPED_COLOUR if route.edge.idle else MODE_COLOURS.get(route.edge.mode, "#4e79a7")
        axes.add_patch(FancyArrowPatch(path=curve, arrowstyle="-|>", mutation_scale=12, linewidth=1.5,
                                       linestyle=styles[route.style], color=colour))
        axes.text(*route.label_at, route.edge.label, ha="center", va="center", fontsize=7, color="#1f2328",
                  bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    for node in sketch.nodes:
        x, y, w, h = shape.boxes[node.name]
        colour = sketch.colour(node.name)
        axes.add_patch(FancyBboxPatch(
            (x, y), w, h, boxstyle="round,pad=0,rounding_size=8", facecolor=colour + "22", edgecolor=colour,
            linewidth=2.6 if node.output else 1.2, linestyle="solid" if node.generate else (0, (4, 2)),
        ))
        axes.text(x + w / 2, y + 17, node.name, ha="center", va="center", fontsize=8.5, fontweight="bold")
        axes.text(x + w / 2, y + 33, node.detail, ha="center", va="center", fontsize=6.5, color="#59636e")
    destination = Path(path)
    image = io.BytesIO()
    figure.savefig(image, dpi=dpi, format="png")
    write_atomic(destination, image.getvalue())
    return destination
