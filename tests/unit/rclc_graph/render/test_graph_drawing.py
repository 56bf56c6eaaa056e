"""Drawings: layered layout, Mermaid text, inline SVG and the offline PNG."""

from __future__ import annotations

from rclc_graph import load_graph_text, validate
from rclc_graph.render.drawing import layout, save_png, sketch_blueprint, sketch_plan, to_mermaid, to_svg
from rclc_graph import compile_plan

from tests.helpers.graph_runs import CHAIN_INPUTS, CHAIN_YAML

LOOP_YAML = """\
version: 1
name: loop_and_foreach
inputs: {question: str, documents: "list[str]"}
models: [{name: base, source: embedded}]
agents: [{name: a, model: base}]
nodes:
  - {name: reader, agent: a, foreach: documents, generate: false, prompt: "{question} {item}"}
  - {name: pro, agent: a, prompt: "argue for {question}"}
  - {name: con, agent: a, prompt: "argue against {question}"}
  - {name: judge, agent: a, output: true, prompt: "decide {question}"}
edges:
  - {source: reader, target: pro}
  - {source: pro, target: con, policy: {mode: text}}
  - {source: con, target: pro, rounds: 2, policy: {mode: text}}
  - {source: con, target: judge, policy: {mode: full}}
"""


def test_layout_puts_each_node_right_of_its_senders():
    sketch = sketch_blueprint(validate(load_graph_text(LOOP_YAML)))
    positions = layout(sketch)
    assert positions["reader"][0] == 0 and positions["pro"][0] == 1
    assert positions["con"][0] == 2 and positions["judge"][0] == 3  # the loop edge is not a layering edge
    plan = compile_plan(load_graph_text(LOOP_YAML), {"question": "q", "documents": ["a", "b", "c"]})
    plan_positions = layout(sketch_plan(plan))
    assert {plan_positions[f"reader[{i}]"][0] for i in range(3)} == {0}
    assert sorted(plan_positions[f"reader[{i}]"][1] for i in range(3)) == [-1.0, 0.0, 1.0]  # centred
    for edge in plan.edges:
        assert plan_positions[edge.source][0] < plan_positions[edge.target][0]


def test_mermaid_shows_nodes_policies_loops_and_outputs():
    text = to_mermaid(sketch_blueprint(validate(load_graph_text(LOOP_YAML))))
    lines = text.splitlines()
    assert lines[:2] == ["%% loop_and_foreach", "flowchart LR"]
    assert 'n0["reader<br/><small>agent a, one per documents, reads only</small>"]' in lines[2]
    assert 'n3(["judge<br/><small>agent a</small>"])' in text  # output: rounded
    assert '    n0 ==>|"r4"| n1' in lines  # state edge
    assert '    n1 -- "text" --> n2' in lines  # text edge ...
    # issue 16 item 18: ... drawn dashed, as the docstring and the SVG say (it was solid)
    text_index = [line for line in lines if "-->" in line or "==>" in line or ".->" in line].index('    n1 -- "text" --> n2')
    assert f"    linkStyle {text_index} stroke-dasharray:6 4" in lines
    assert '    n2 -. "text, next round" .-> n1' in lines  # loop edge
    assert '    n2 ==>|"full"| n3' in lines
    assert lines[-1] == "    class n3 output"


def test_svg_is_standalone_and_escaped():
    sketch = sketch_plan(compile_plan(load_graph_text(CHAIN_YAML), CHAIN_INPUTS))
    sketch.nodes[0] = type(sketch.nodes[0])("<x&y>", "<script>")
    sketch.edges[0] = type(sketch.edges[0])("<x&y>", "reader_2", "r2 <b>")
    svg = to_svg(sketch)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "<script" not in svg and "&lt;x&amp;y&gt;" in svg and "r2 &lt;b&gt;" in svg
    assert "href" not in svg


def test_png_is_written_offline(tmp_path):
    sketch = sketch_blueprint(validate(load_graph_text(LOOP_YAML)))
    path = save_png(sketch, tmp_path / "graph.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
