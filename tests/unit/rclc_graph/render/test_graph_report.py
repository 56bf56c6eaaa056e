"""report.html: self-contained, escaped, and showing the right kept spans."""

from __future__ import annotations

import re

import anyio

from rclc_graph import compile_plan, load_graph_text, run_plan
from rclc_graph.run import RecordingExecutor
from rclc_graph.run import RunRecorder
from rclc_graph.render.html_report import kept_prompt_tokens, marked_prompt, render_report

from tests.helpers.graph_runs import CHAIN_INPUTS, CHAIN_YAML, FakeExecutor, tokens_of


def fake_record(tmp_path):
    async def go():
        plan = compile_plan(load_graph_text(CHAIN_YAML), CHAIN_INPUTS)
        recorder = RunRecorder(tmp_path, plan, run_id="h1")
        recorder.start()
        result = await run_plan(plan, executor=RecordingExecutor(FakeExecutor(), recorder), run_id="h1")
        return recorder.finish(result), result

    return anyio.run(go)


def test_every_document_and_model_string_is_escaped(tmp_path):
    record, _ = fake_record(tmp_path)
    page = (tmp_path / "h1" / "report.html").read_text(encoding="utf-8")
    assert page == render_report(record)
    # the document, the question and the generated text all contain DANGER
    assert "<script" not in page.lower()
    assert "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("&lt;script&gt;") >= 3  # inputs, prompts (kept-span views), outputs


def test_the_page_loads_nothing_from_outside(tmp_path):
    record, _ = fake_record(tmp_path)
    page = render_report(record)
    assert not re.search(r"<(link|script|iframe|img|object|embed)\b", page, re.I)
    assert "@import" not in page and not re.search(r"url\((?!#)", page)  # only in-page SVG markers
    assert re.findall(r"https?://[^\"' )]+", page) == ["http://www.w3.org/2000/svg"]  # the SVG namespace only
    assert "default-src 'none'" in page  # and the browser is told so
    assert "<svg" in page and "reader_1" in page and "final" in page


def test_report_shows_hops_lineage_and_outputs(tmp_path):
    record, result = fake_record(tmp_path)
    page = render_report(record)
    assert "Handoffs" in page and "Lineage" in page and "Kept spans" in page and "Outputs" in page
    for hop in record["hops"]:
        assert f"{hop['source']} → {hop['target']}" in page
    assert "finished" in page


def test_kept_prompt_tokens_follow_lineage(tmp_path):
    record, result = fake_record(tmp_path)
    survived = kept_prompt_tokens(record)
    # the fake executor keeps every other position on each hop
    reader_1_tokens = len(tokens_of(result.nodes["reader_1"].prompt_text))
    assert survived["reader_1"]["reader_2"]["tokens"] == list(range(0, reader_1_tokens, 2))
    assert survived["reader_1"]["reader_2"]["hops"] == [1]
    assert survived["reader_1"]["final"]["tokens"] == list(range(0, reader_1_tokens, 4))
    assert survived["reader_1"]["final"]["hops"] == [2]
    assert "final" not in survived  # nothing downstream of the output node
    # prompt indices come from lineage origin indices minus the origin's prompt_start
    reader_2 = result.nodes["reader_2"]
    expected = sorted(
        origin.index - reader_2.prompt_start
        for origin in result.nodes["final"].lineage
        if origin.node == "reader_2" and origin.kind == "prompt"
    )
    assert survived["reader_2"]["final"]["tokens"] == expected


def test_marked_prompt_marks_exactly_the_kept_tokens():
    text = "alpha beta <gamma> delta"
    offsets = [[0, 6], [6, 11], [11, 19], [19, 24]]
    html = marked_prompt(text, offsets, [1, 2], "#123456")
    assert html == (
        'alpha <mark style="background:#12345655">beta </mark>'
        '<mark style="background:#12345655">&lt;gamma&gt; </mark>delta'
    )
    # characters no token covers are kept, unmarked; overlapping offsets do not repeat text
    assert marked_prompt("ab cd", [[0, 2], [1, 2], [3, 5]], [2], "#000000") == (
        'ab <mark style="background:#00000055">cd</mark>'
    )
