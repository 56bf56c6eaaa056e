"""Summary maths on hand-written rows, the printed table, and the report files."""

from __future__ import annotations

import pytest
from rich.console import Console

from rclc_graph.experiments.arms import parse_arms
from rclc_graph.experiments.figures import markdown_table, write_report
from rclc_graph.experiments.summary import MEASURES, format_bytes, summarise, summarise_arm, table, versus


def _row(case, arm, correct, latency, *, status="finished", kept=10, sent=40, payload=1000, evidence=None, hops=1, answer="x"):
    return {
        "case": case, "arm": arm, "status": status, "correct": correct, "latency_s": latency, "answer": answer,
        "selection_s": 0.1, "generation_s": 0.5, "positions_kept": kept, "positions_sent": sent, "payload_bytes": payload,
        "output_positions": None if kept is None else kept + 5, "hops": [{}] * hops, "evidence_at_output": evidence,
        "evidence": None if evidence is None else {"evidence_tokens": 4, "nodes": [
            {"node": "g", "depth": 0, "surviving": 4}, {"node": "f", "depth": 1, "surviving": round(evidence * 4)}]},
        "model_fingerprints": {"base": "abc"},
    }


def test_arm_measures():
    rows = [
        _row("a", "r4", True, 1.0, kept=10, sent=40, payload=100, evidence=0.5),
        _row("b", "r4", False, 3.0, kept=20, sent=80, payload=300, evidence=1.0),
        _row("c", "r4", True, 2.0, kept=30, sent=120, payload=200, evidence=None),
        _row("d", "r4", False, 99.0, status="failed", kept=None, sent=None, payload=None, answer=None),
    ]
    measures = summarise_arm(rows)
    assert measures["cases"] == 4 and measures["finished"] == 3 and measures["failed"] == 1 and measures["correct"] == 2
    assert measures["accuracy"] == 0.5  # the failed run counts as wrong
    low, high = measures["accuracy_ci"]
    assert 0 <= low <= 0.5 <= high <= 1
    assert measures["median_latency_s"] == 2.0  # failed runs have no latency to speak of
    assert measures["mean_latency_s"] == 2.0
    assert measures["positions"] == 20 and measures["positions_sent"] == 80 and measures["compression"] == 4.0
    assert measures["payload_bytes"] == 200 and measures["output_positions"] == 25
    assert measures["evidence_survival"] == 0.75 and measures["evidence_cases"] == 2
    assert measures["evidence_by_depth"] == {"0": 1.0, "1": 0.75}
    assert measures["answer_chars"] == 1 and measures["model_fingerprints"] == ["base=abc"]


def test_no_hops_no_compression_and_empty_arms():
    measures = summarise_arm([_row("a", "q", False, 1.0, kept=0, sent=0, hops=0)])
    assert measures["compression"] is None and measures["positions"] == 0
    empty = summarise_arm([])
    assert empty["accuracy"] is None and empty["accuracy_ci"] is None and empty["cases"] == 0


def test_summary_keeps_this_runs_cases_and_arms_and_latest_rows():
    arms = parse_arms(["r4=state:ratio=4", "floor=question_only"])
    rows = [
        _row("a", "r4", False, 1.0),
        _row("a", "r4", True, 1.0),  # the newer row wins
        _row("b", "r4", True, 1.0),
        _row("z", "r4", False, 1.0),  # another case: ignored
        _row("a", "old_arm", False, 1.0),  # another arm: ignored
        _row("a", "floor", False, 0.5, hops=0),
    ]
    data = summarise(rows, arms, ["a", "b"], metadata={"topology": {"name": "t"}})
    assert list(data["arms"]) == ["r4", "floor"]
    assert data["arms"]["r4"]["accuracy"] == 1.0 and data["arms"]["r4"]["cases"] == 2
    assert data["arms"]["floor"]["cases"] == 1 and data["missing_rows"] == 1
    for measure in MEASURES:
        assert measure in data["arms"]["r4"]
    assert data["arms"]["floor"]["mode"] == "question_only" and data["arms"]["r4"]["label"] == "r4"
    assert data["intervals"] == {"method": "wilson", "confidence": 0.95} and data["topology"] == {"name": "t"}


def test_table_markdown_and_report(tmp_path):
    arms = parse_arms(["r4=state:ratio=4", "full=full", "floor=question_only"])
    rows = [_row(c, "r4", c != "a", 1.0) for c in "abc"] + [_row(c, "full", True, 2.0, kept=40) for c in "abc"]
    rows += [_row(c, "floor", False, 0.2, kept=0, sent=0, hops=0) for c in "abc"]
    data = summarise(rows, arms, list("abc"), metadata={"topology": {"name": "t", "path": "t.yaml"}})
    console = Console(record=True, width=200)
    console.print(table(data))
    text = console.export_text()
    assert "r4" in text and "66.7%" in text and "44%-100%" in text and "4.0x" in text and "floor" in text
    assert "vs r4" in text and "p=0.500 (+0/-2)" in text  # floor lost the two cases r4 got right
    markdown = markdown_table(data)
    # issue 16 item 20: 0/3 is [0%, 56.1%] (Wilson), not the bootstrap's collapsed [0%, 0%]
    assert markdown.count("\n") == 4 and "| floor | question_only | 3 | 0.0% [0.0%, 56.1%] | p=0.500 (+0/-2) |" in markdown
    paths = write_report(data, tmp_path)
    for key in ("compression_plot", "latency_plot"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = paths["report"].read_text()
    assert "](accuracy_vs_compression.png)" in report and "](accuracy_vs_latency.png)" in report
    assert markdown in report
    assert "## Paired tests" in report and "| r4 | floor | 3 | 0 | 2 | 0 | 1 | 0.500 |" in report


# issue 16 item 20: paired exact tests between arms on the same cases, stored for every pair
def test_summary_stores_every_pairs_mcnemar_test_on_shared_cases():
    arms = parse_arms(["new=state:ratio=4", "seed=state:ratio=4,selector=qsnap", "floor=question_only"])
    cases = [f"c{i}" for i in range(12)]
    rows = []
    for index, case in enumerate(cases):
        rows.append(_row(case, "new", index < 10, 1.0))  # right on c0..c9
        rows.append(_row(case, "seed", index < 3 or index == 11, 1.0))  # right on c0..c2 and c11
        if index < 6:  # floor ran only half the cases
            rows.append(_row(case, "floor", index == 0, 1.0, hops=0))
    data = summarise(rows, arms, cases)
    paired = data["paired"]
    assert paired["reference"] == "new" and paired["test"] == "mcnemar_exact_two_sided"
    assert [(p["first"], p["second"]) for p in paired["pairs"]] == [("new", "seed"), ("new", "floor"), ("seed", "floor")]
    new_seed = paired["pairs"][0]
    assert (new_seed["both_correct"], new_seed["only_first"], new_seed["only_second"], new_seed["both_wrong"]) == (3, 7, 1, 1)
    assert new_seed["cases"] == 12 and new_seed["p_value"] == pytest.approx(2 * (1 + 8) / 256)  # 0.0703
    new_floor = paired["pairs"][1]
    assert new_floor["cases"] == 6 and (new_floor["only_first"], new_floor["only_second"]) == (5, 0)
    assert new_floor["p_value"] == pytest.approx(2 / 32)
    assert versus(data, "seed", "new") == {"cases": 12, "only_arm": 1, "only_reference": 7, "p_value": new_seed["p_value"]}
    # another reference arm orients the table's cells around it
    again = summarise(rows, arms, cases, reference="seed")
    console = Console(record=True, width=200)
    console.print(table(again))
    text = console.export_text()
    assert "vs seed" in text and "p=0.070 (+7/-1)" in text and "ref" in text
    with pytest.raises(ValueError, match="no arm named 'nope'"):
        summarise(rows, arms, cases, reference="nope")


# issue 16 item 20: the first case's warm-up (model loading) leaves the latency median
def test_latency_median_leaves_out_warmup_rows():
    rows = [_row("a", "r4", True, 40.0), _row("b", "r4", True, 1.0), _row("c", "r4", True, 3.0)]
    rows[0]["warmup"] = True
    measures = summarise_arm(rows)
    assert measures["median_latency_s"] == 2.0 and measures["latency_runs"] == 2
    assert measures["latency_includes_warmup"] is False
    alone = summarise_arm(rows[:1])
    assert alone["median_latency_s"] == 40.0 and alone["latency_includes_warmup"] is True


@pytest.mark.parametrize(("value", "text"), [(None, "-"), (512, "512 B"), (2048, "2.0 KiB"), (3 << 20, "3.0 MiB"), (5 << 30, "5.0 GiB")])
def test_format_bytes(value, text):
    assert format_bytes(value) == text
