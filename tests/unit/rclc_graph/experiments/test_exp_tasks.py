"""Task families (rclc_graph/experiments/tasks): each generator is deterministic per seed,
writes well-formed cases, and has the property its family claims."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from typer.testing import CliRunner

from rclc_graph.experiments.commands import app
from rclc_graph.experiments.datasets import read_dataset
from rclc_graph.experiments.scoring import normalise
from rclc_graph.experiments.synthetic import make_dataset, pieces
from rclc_graph.experiments.tasks import FAMILIES, make_family
from rclc_graph.experiments.tasks.lexical import content_stems, shared_stems, stem
from rclc_graph.experiments.tasks.relations import ORG_RELATIONS, PERSON_RELATIONS, Relation
from rclc_graph.experiments.tasks.vocabulary import words

SHORT = ("profiles", "paraphrase", "two-hop")


def as_json(cases):
    return [case.as_json() for case in cases]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("documents", [3, 4])
def test_same_seed_same_cases_other_seed_other_cases(family, documents):
    first = make_family(family, 12, seed=5, documents=documents)
    assert as_json(first) == as_json(make_family(family, 12, seed=5, documents=documents))
    assert as_json(make_family(family, 12, seed=6, documents=documents)) != as_json(first)
    if family != "single-fact":  # every case has its own generator: case i does not depend on the size
        assert as_json(make_family(family, 3, seed=5, documents=documents)) == as_json(first[:3])


def test_single_fact_is_the_first_generator():
    assert as_json(make_family("single-fact", 20, seed=4, documents=4)) == as_json(make_dataset(20, seed=4, documents=4))


def _answer_words(case):
    return [rf"\b{re.escape(normalise(answer))}\b" for answer in case.answers]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_case_is_well_formed_and_its_answer_only_in_its_evidence(family, tmp_path):
    cases = make_family(family, 60, seed=11, documents=4)
    for case in cases:
        items = case.evidence_items()
        assert items and all(document is not None and sentence in document for document, sentence in items)
        everything = "\n".join(case.documents)
        for _, sentence in items:
            assert everything.count(sentence) == 1
        outside = normalise(everything)
        for _, sentence in items:
            outside = outside.replace(normalise(sentence), " ")
        # the first generator draws values with replacement (another project may be based in
        # the answer's city); the newer families never repeat a value
        if "single-fact" not in (family, case.meta.get("base_family")):
            for word in _answer_words(case):
                assert not re.search(word, outside) and not re.search(word, normalise(case.question))
        assert re.search(_answer_words(case)[0], normalise(" ".join(s for _, s in items)))
    path = tmp_path / "cases.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["data", "make", "--family", family, "--size", "60", "--seed", "11",
                                 "--documents", "4", "--out", str(path)])
    assert result.exit_code == 0, result.output
    assert as_json(read_dataset(path)) == as_json(cases)  # the CLI writes what make_family makes, and it reads back


@pytest.mark.parametrize("family", SHORT)
def test_gold_documents_and_relations_are_spread_evenly(family):
    cases = make_family(family, 400, seed=2, documents=4)
    gold = Counter(index for case in cases for index, _ in zip(_golds(case), range(1)))
    assert set(gold) == {0, 1, 2, 3} and min(gold.values()) > 70  # 100 expected each
    relations = Counter(case.meta["relation"] for case in cases)
    assert min(relations.values()) > 0.6 * max(relations.values())


def _golds(case):
    return case.gold_document if isinstance(case.gold_document, tuple) else (case.gold_document,)


def _asked(case):
    name = case.meta["entity"].split()[1]
    return name, case.meta["relation"]


def test_profiles_need_both_the_entity_and_the_relation():
    cases = make_family("profiles", 300, seed=3, documents=3)
    mentioned_elsewhere = 0
    for case in cases:
        name, relation = _asked(case)
        facts = case.meta["facts"]
        gold = case.gold_document
        assert sum(1 for s, r, _, _ in facts if (s, r) == (name, relation)) == 1
        # the asked organisation has other facts, and a rival in its document has the asked relation
        assert any(s == name and r != relation for s, r, _, _ in facts)
        assert any(s != name and r == relation and d == gold for s, r, _, d in facts)
        assert case.meta["entity"] in case.question.replace("The ", "the ")
        others = {d for s, _, _, d in facts if s == name and d != gold}
        mentioned_elsewhere += bool(others)
        assert len(case.documents[gold]) > 200  # several organisations and filler per document
    assert 0.35 * len(cases) < mentioned_elsewhere < 0.65 * len(cases)


def test_paraphrase_questions_share_no_content_word_with_their_evidence():
    cases = make_family("paraphrase", 300, seed=4, documents=4)
    for case in cases:
        ignore = case.meta["entity"]
        assert not shared_stems(case.question, case.evidence, ignore=ignore), (case.question, case.evidence)
        relation = ORG_RELATIONS[case.meta["relation"]]
        assert case.question not in {form.format(s=ignore) for form in relation.questions}
    # the contrast: a profiles question shares a word with its evidence in a third of the cases
    profiles = make_family("profiles", 300, seed=4, documents=4)
    overlap = sum(bool(shared_stems(case.question, case.evidence, ignore=case.meta["entity"])) for case in profiles)
    assert overlap > 0.25 * len(profiles)
    # and the wordings vary: many distinct question forms per relation
    forms = Counter(re.sub(r"the \w+ \w+", "X", case.question) for case in cases)
    assert len(forms) >= 20


def test_stems_join_forms_of_one_word():
    assert stem("owns") == stem("owned") == stem("owner") == stem("ownership") == stem("own")
    assert stem("study") == stem("studied") and stem("based") == stem("base") and stem("made") == stem("make")
    assert content_stems("Who is the owner of the Cedar lab?", ignore="the Cedar lab") == {"own"}


def test_two_hop_needs_two_documents():
    cases = make_family("two-hop", 300, seed=5, documents=4)
    for case in cases:
        (near, far), (first, second) = case.gold_document, case.evidence
        assert near != far
        bridge = case.meta["bridge"]
        organisation = case.meta["entity"]
        assert bridge in first and organisation.split()[1] in first  # the hop the question names
        assert bridge in second and organisation.split()[1] not in second  # the hop it names only through it
        assert bridge not in case.question and organisation in case.question.replace("The ", "the ")
        assert not any(re.search(word, normalise(first)) for word in _answer_words(case))  # the first hop holds no answer
        # the bridge person is named in no other document than those two... except as a same-kind trap
        facts = case.meta["facts"]
        kind = PERSON_RELATIONS[case.meta["relation"].split(">")[1]].value
        assert any(r == case.meta["relation"].split(">")[1] and s != bridge for s, r, _, _ in facts)  # rivals' attributes
        assert kind in ("city", "year")
    traps = sum(1 for case in cases if len({s for s, r, _, _ in case.meta["facts"] if s == case.meta["entity"].split()[1]}) > 0
                and sum(1 for s, r, _, _ in case.meta["facts"] if s == case.meta["entity"].split()[1]) > 1)
    assert 0.4 * len(cases) < traps < 0.95 * len(cases)


def test_long_cases_have_long_documents_over_every_base_family():
    cases = make_family("long", 60, seed=6, documents=(3, 6))
    assert set(Counter(case.meta["base_family"] for case in cases)) == {"single-fact", "profiles", "paraphrase", "two-hop"}
    assert len({len(case.documents) for case in cases}) >= 3
    for case in cases:
        for document in case.documents:
            assert 280 <= pieces(document) <= 600 and "\n\n" in document
    # the lengthened cases are not their base family's cases of the same seed
    profiles = {case.question for case in make_family("profiles", 60, seed=6, documents=4)}
    assert not profiles & {case.question for case in cases if case.meta["base_family"] == "profiles"}


@pytest.mark.parametrize(
    ("family", "kwargs", "message"),
    [("nope", {}, "not one of"), ("profiles", {"documents": (3, 5)}, "range is for long"),
     ("two-hop", {"documents": 1}, "at least 2"), ("profiles", {"document_tokens": (300, 600)}, "only the long"),
     ("long", {"documents": 1}, "at least 2"), ("profiles", {"documents": 11}, "at most 10"),
     ("profiles", {"size": 0}, "size")],
)
def test_bad_family_options_are_refused(family, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_family(family, **{"size": 3, **kwargs})


def test_cli_refuses_single_fact_options_for_other_families(tmp_path):
    result = CliRunner().invoke(app, ["data", "make", "--family", "profiles", "--facts-per-document", "3",
                                      "--size", "2", "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and "only the single-fact family" in result.output


def _leaves(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def test_the_words_file_holds_only_text_in_the_shape_the_generators_read():
    """words.yaml is read through importlib.resources (the installed copy when installed); YAML
    would read an unquoted `no` or `1982` as a bool or a number, so every leaf must be a string."""
    data = words()
    assert set(data) == {"org_names", "org_kinds", "first_names", "last_names", "cities", "products", "filler",
                         "org_relations", "person_relations", "bridges"}
    assert set(data["filler"]) == {"subjects", "verbs", "objects", "tails"}
    assert all(isinstance(leaf, str) for leaf in _leaves(data))
    assert all(len(pair) == 2 for pair in data["products"])
    relation_fields = {field for field in Relation.__dataclass_fields__}
    for entry in data["org_relations"] + data["person_relations"]:
        assert set(entry) <= relation_fields and entry["subject"] in ("org", "person"), entry["name"]
    assert set(data["bridges"]) <= {entry["name"] for entry in data["org_relations"] if entry.get("roles")}
