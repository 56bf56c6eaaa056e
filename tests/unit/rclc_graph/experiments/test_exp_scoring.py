"""Scoring: normalised whole-word containment, and user scorers only with trust_code."""

from __future__ import annotations

import sys
import types

import pytest

from rclc_graph.experiments.scoring import containment, load_scorer, normalise


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Alice   MORENO. ", "alice moreno"),
        ("O'Neil, Jr.", "o neil jr"),
        ("Straße", "strasse"),  # case folding, not just lower()
        ("ﬁle\u00a0name", "file name"),  # NFKC ligature and no-break space
        ("a\n\tb", "a b"),
        ("$1,984!", "1 984"),
        ("...", ""),
    ],
)
def test_normalise(text, expected):
    assert normalise(text) == expected


@pytest.mark.parametrize(
    ("output", "answers", "expected"),
    [
        ("It is owned by Alice Moreno.", ["Alice Moreno"], True),
        ("alice moreno", ["Alice  Moreno!"], True),
        ("The project is based in Oslo", ["Lima", "Oslo"], True),
        ("Founded in 1984.", ["1984"], True),
        ("Founded in 1984.", ["19"], False),  # whole words only
        ("It is in Limassol.", ["Lima"], False),
        ("Alice", ["Alice Moreno"], False),
        ("", ["Oslo"], False),
        ("Oslo", ["..."], False),  # an answer that normalises to nothing never matches
        ("Moreno, Alice", ["Alice Moreno"], False),  # order matters
    ],
)
def test_containment(output, answers, expected):
    assert containment(output, answers) is expected


def test_default_scorer_and_trust_code(monkeypatch):
    scorer = load_scorer()
    assert scorer.name == "containment" and scorer("Oslo.", ["oslo"]) is True
    assert load_scorer("containment").name == "containment"
    module = types.ModuleType("exp_scorer_mod")
    module.exact = lambda output, answers: output in answers
    module.number = lambda output, answers: 1
    module.value = 3
    monkeypatch.setitem(sys.modules, "exp_scorer_mod", module)
    with pytest.raises(ValueError, match="trust-code"):
        load_scorer("exp_scorer_mod:exact")
    exact = load_scorer("exp_scorer_mod:exact", trust_code=True)
    assert exact.name == "exp_scorer_mod:exact" and exact("Oslo", ["Oslo"]) and not exact("Oslo.", ["Oslo"])
    with pytest.raises(TypeError, match="expected a bool"):
        load_scorer("exp_scorer_mod:number", trust_code=True)("a", ["a"])
    for reference, message in (("exp_scorer_mod:missing", "no attribute"), ("exp_scorer_mod:value", "not callable"),
                               ("no_such_module_xyz:f", "cannot import"), ("not a ref", "neither")):
        with pytest.raises(ValueError, match=message):
            load_scorer(reference, trust_code=True)
