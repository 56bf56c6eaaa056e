"""Evidence survival from lineage, on hand-built lineages whose answers are known."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from rclc_graph.experiments.evidence import evidence_span, evidence_survival, evidence_token_indices
from rclc_graph.results.lineage import Lineage, compose_hop, receiver_lineage

DOC = "Filler one here. The Cedar project is owned by Ann Lee. Filler two."
EVIDENCE = "The Cedar project is owned by Ann Lee."
OTHER = "Nothing about it. Just filler text."


@dataclass
class Node:
    prompt_text: str
    prompt_start: int
    prompt_offsets: list
    lineage: Lineage


@dataclass
class HopLike:
    source: str
    target: str
    mode: str


def words(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\S+", text)]


def reader(name: str, text: str, handoffs=()) -> Node:
    offsets = words(text)
    inherited = sum(len(h) for h in handoffs)
    return Node(text, inherited, offsets, receiver_lineage(name, list(handoffs), len(offsets)))


def evidence_positions(node: Node) -> list[int]:
    span = evidence_span(node.prompt_text, EVIDENCE, DOC)
    return [node.prompt_start + i for i in evidence_token_indices(node.prompt_offsets, span)]


def test_token_overlap_rules():
    offsets = [(0, 3), (3, 4), (4, 4), (5, 9), (9, 12)]
    assert evidence_token_indices(offsets, (3, 6)) == [1, 3]  # partial overlaps count, empty spans never
    assert evidence_token_indices(offsets, (12, 20)) == []
    assert evidence_span("xx " + DOC, EVIDENCE, DOC) == (3 + DOC.index(EVIDENCE), 3 + DOC.index(EVIDENCE) + len(EVIDENCE))
    assert evidence_span("xx " + DOC, None, DOC) == (3, 3 + len(DOC))
    assert evidence_span("xx " + EVIDENCE, EVIDENCE, None) == (3, 3 + len(EVIDENCE))
    assert evidence_span(OTHER, EVIDENCE, DOC) is None
    assert evidence_span(EVIDENCE + " " + OTHER, EVIDENCE, OTHER) is None  # only inside the document


def test_fan_out_counts_exactly_the_kept_evidence_tokens():
    gold = reader("reader[1]", "Question: who?\nDocument 1:\n" + DOC)
    other = reader("reader[0]", "Question: who?\nDocument 0:\n" + OTHER)
    evidence = evidence_positions(gold)
    assert len(evidence) == 8  # "The Cedar project is owned by Ann Lee."
    kept = [0, evidence[1], evidence[5], evidence[7], len(gold.lineage) - 1]
    hop_gold = compose_hop(gold.lineage, kept, source="reader[1]", target="final", inherited_positions=0, budget=5)
    hop_other = compose_hop(other.lineage, [0, 1], source="reader[0]", target="final", inherited_positions=0, budget=2)
    final = reader("final", "Question: who?\nAnswer:", [hop_other.lineage, hop_gold.lineage])
    nodes = {"reader[0]": other, "reader[1]": gold, "final": final}
    hops = [HopLike("reader[0]", "final", "state"), HopLike("reader[1]", "final", "state")]
    survival = evidence_survival(nodes, hops, ["final"], evidence=EVIDENCE, document=DOC)
    assert survival.gold_nodes == ("reader[1]",) and survival.evidence_tokens == 8
    assert [(n.node, n.depth, n.surviving) for n in survival.nodes] == [("reader[1]", 0, 8), ("final", 1, 3)]
    assert survival.output == "final" and survival.at_output == 3 and survival.fraction_at_output == 3 / 8
    data = survival.to_dict()
    assert data["nodes"][1] == {"node": "final", "depth": 1, "surviving": 3, "fraction": 3 / 8}
    # without a sentence, the whole gold document is the evidence
    whole = evidence_survival(nodes, hops, ["final"], evidence=None, document=DOC)
    assert whole.evidence_tokens == len(DOC.split()) and whole.at_output == 4  # kept[0] and the last token are not document


def test_chain_follows_inherited_positions_through_every_hop():
    first = reader("reader_1", "Question: who?\nPart 1:\n" + OTHER)
    hop1 = compose_hop(first.lineage, range(0, len(first.lineage), 2), source="reader_1", target="reader_2",
                       inherited_positions=0, budget=len(first.lineage))
    gold = reader("reader_2", "Part 2:\n" + DOC, [hop1.lineage])
    assert gold.prompt_start == len(hop1.lineage) > 0
    evidence = evidence_positions(gold)
    # keep everything inherited plus the first half of the evidence
    kept2 = list(range(gold.prompt_start)) + evidence[:4]
    hop2 = compose_hop(gold.lineage, kept2, source="reader_2", target="reader_3", inherited_positions=gold.prompt_start,
                       budget=len(kept2))
    third = reader("reader_3", "Part 3:\n" + OTHER, [hop2.lineage])
    inherited_evidence = [i for i, o in enumerate(third.lineage) if o.node == "reader_2"]
    kept3 = [0] + inherited_evidence[1:3] + [len(third.lineage) - 1]  # two of the four survive
    hop3 = compose_hop(third.lineage, kept3, source="reader_3", target="final", inherited_positions=third.prompt_start,
                       budget=len(kept3))
    final = reader("final", "Question: who?\nAnswer:", [hop3.lineage])
    nodes = {"reader_1": first, "reader_2": gold, "reader_3": third, "final": final}
    hops = [HopLike("reader_1", "reader_2", "state"), HopLike("reader_2", "reader_3", "state"),
            HopLike("reader_3", "final", "state")]
    survival = evidence_survival(nodes, hops, ["final"], evidence=EVIDENCE, document=DOC)
    assert survival.gold_nodes == ("reader_2",)
    assert [(n.node, n.depth, n.surviving) for n in survival.nodes] == [("reader_2", 0, 8), ("reader_3", 1, 4), ("final", 2, 2)]
    assert survival.fraction_at_output == 0.25


def test_text_hops_end_the_trail_and_quoting_receivers_are_not_gold():
    gold = reader("reader[0]", "Document:\n" + DOC)
    gold.lineage = gold.lineage.extend("reader[0]", 5, "token")  # it wrote a report
    # the receiver's prompt starts with the sender's text, which quotes the whole document
    final = reader("final", "Report: " + DOC + "\n\nQuestion: who?")
    nodes = {"reader[0]": gold, "final": final}
    survival = evidence_survival(nodes, [HopLike("reader[0]", "final", "text")], ["final"], evidence=EVIDENCE, document=DOC)
    assert survival.gold_nodes == ("reader[0]",)
    assert survival.output is None and survival.at_output is None and survival.fraction_at_output is None
    assert [n.node for n in survival.nodes] == ["reader[0]"]


def test_single_node_and_unmeasurable_cases():
    single = reader("final", OTHER + "\n" + DOC + "\n\nQuestion: who?")
    survival = evidence_survival({"final": single}, [], ["final"], evidence=EVIDENCE, document=DOC)
    assert survival.fraction_at_output == 1.0 and survival.nodes[0].depth == 0
    question_only = reader("final", "Question: who?")
    assert evidence_survival({"final": question_only}, [], ["final"], evidence=EVIDENCE, document=DOC) is None
    assert evidence_survival({"final": single}, [], ["final"], evidence=None, document=None) is None


def test_inconsistent_node_records_are_refused():
    broken = reader("final", DOC)
    broken.prompt_start = 50  # says the prompt starts past the end of its state
    with pytest.raises(ValueError, match="prompt_start or prompt_offsets disagree"):
        evidence_survival({"final": broken}, [], ["final"], evidence=EVIDENCE, document=DOC)


SECOND_DOC = "Ann Lee lives in Oslo. Other filler."
SECOND = "Ann Lee lives in Oslo."


def test_an_answer_needing_two_documents_counts_both_facts():
    """Two-hop cases: one (document, sentence) pair per fact; a gold reader per fact, and the
    evidence tokens are the union of both facts' tokens."""
    first = reader("reader[0]", "Question: where?\nDocument 0:\n" + DOC)
    second = reader("reader[1]", "Question: where?\nDocument 1:\n" + SECOND_DOC)
    span = evidence_span(second.prompt_text, SECOND, SECOND_DOC)
    second_evidence = [second.prompt_start + i for i in evidence_token_indices(second.prompt_offsets, span)]
    first_evidence = evidence_positions(first)
    hop_a = compose_hop(first.lineage, [0, *first_evidence], source="reader[0]", target="final", inherited_positions=0,
                        budget=9)
    hop_b = compose_hop(second.lineage, [0, second_evidence[0]], source="reader[1]", target="final",
                        inherited_positions=0, budget=2)
    final = reader("final", "Question: where?\nAnswer:", [hop_a.lineage, hop_b.lineage])
    nodes = {"reader[0]": first, "reader[1]": second, "final": final}
    hops = [HopLike("reader[0]", "final", "state"), HopLike("reader[1]", "final", "state")]
    survival = evidence_survival(nodes, hops, ["final"], items=[(DOC, EVIDENCE), (SECOND_DOC, SECOND)])
    assert survival.gold_nodes == ("reader[0]", "reader[1]")
    assert survival.evidence_tokens == 8 + 5 and survival.at_output == 8 + 1
    # one pair is the single-fact call
    one = evidence_survival(nodes, hops, ["final"], items=[(DOC, EVIDENCE)])
    assert one.to_dict() == evidence_survival(nodes, hops, ["final"], evidence=EVIDENCE, document=DOC).to_dict()
    assert evidence_survival(nodes, hops, ["final"], items=[]) is None


def test_kept_text_names_what_reached_the_answerer():
    from rclc_graph.experiments.kept_text import kept_text

    gold = reader("reader[1]", "Question: who?\nDocument 1:\n" + DOC)
    evidence = evidence_positions(gold)
    hop = compose_hop(gold.lineage, [0, *evidence[:3], evidence[-1]], source="reader[1]", target="final",
                      inherited_positions=0, budget=5)
    final = reader("final", "Question: who?\nAnswer:", [hop.lineage])
    pieces = kept_text({"reader[1]": gold, "final": final}, "final")
    assert pieces == [["reader[1]", "Question:"], ["reader[1]", "The Cedar project"], ["reader[1]", "Lee."]]
    assert kept_text({"reader[1]": gold}, "final") is None
