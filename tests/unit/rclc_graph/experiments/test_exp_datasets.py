"""JSONL datasets: round trips, every validation error naming file, line and field, and the
seeded synthetic generator (deterministic, well-formed, unbiased in where the answer sits)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rclc_graph.errors import SpecError
from rclc_graph.experiments.datasets import Case, make_case, read_dataset, write_jsonl
from rclc_graph.experiments.synthetic import make_dataset, write_dataset


def _line(**fields) -> str:
    base = {"documents": ["The Cedar project is owned by Ann.", "Filler."], "question": "Who owns Cedar?", "answers": ["Ann"]}
    base.update(fields)
    return json.dumps({key: value for key, value in base.items() if value is not ...})


def _write(tmp_path, *lines: str | bytes, name: str = "d.jsonl"):
    path = tmp_path / name
    data = b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines)
    path.write_bytes(data)
    return path


def test_round_trip_and_content_ids(tmp_path):
    cases = make_dataset(5, seed=3)
    path = tmp_path / "data.jsonl"
    assert write_jsonl(path, cases) == 5
    read = read_dataset(path)
    assert [case.as_json() for case in read] == [case.as_json() for case in cases]
    assert read_dataset(path, limit=2) == read[:2]
    # without ids, ids come from the content: stable across reordering the file
    lines = [json.dumps({k: v for k, v in case.as_json().items() if k != "id"}) for case in cases]
    forward = read_dataset(_write(tmp_path, *lines, name="a.jsonl"))
    backward = read_dataset(_write(tmp_path, *reversed(lines), name="b.jsonl"))
    assert {c.id for c in forward} == {c.id for c in backward}
    assert all(case.id.startswith("sha-") for case in forward)
    assert forward[0].fingerprint() == backward[-1].fingerprint()


def test_blank_lines_and_bom_are_accepted(tmp_path):
    path = _write(tmp_path, b"\xef\xbb\xbf" + _line(id="a").encode(), "", "   ", _line(id="b"))
    assert [case.id for case in read_dataset(path)] == ["a", "b"]


@pytest.mark.parametrize(
    ("line", "field", "text"),
    [
        (_line(documents=...), "documents", "required field 'documents'"),
        (_line(answers=...), "answers", "required field 'answers'"),
        (_line(question=...), "question", "required field 'question'"),
        (_line(documents=[]), "documents", "non-empty list"),
        (_line(documents="one text"), "documents", "non-empty list"),
        (_line(documents=["ok", ""]), "documents[1]", "non-empty text"),
        (_line(documents=["ok", 3]), "documents[1]", "a number"),
        (_line(question=""), "question", "non-empty text"),
        (_line(answers="Ann"), "answers", 'write "answers": ["Ann"]'),
        (_line(answers=[]), "answers", "non-empty list"),
        (_line(answers=["Ann", 4]), "answers[1]", "expected text"),
        (_line(answers=["..."]), "answers[0]", "every output would contain it"),
        (_line(gold_document=2), "gold_document", "outside the 2 documents"),
        (_line(gold_document=True), "gold_document", "a boolean"),
        (_line(gold_document="0"), "gold_document", "document index"),
        (_line(evidence="Not in any document."), "evidence", "any document"),
        (_line(evidence="The Cedar project is owned by Ann.", gold_document=1), "evidence", "documents[1]"),
        (_line(id=""), "id", "non-empty text"),
        (_line(id=7), "id", "a number"),
        (_line(meta=[1]), "meta", "JSON object"),
        (_line(answer=["Ann"]), "answer", "did you mean 'answers'"),
    ],
)
def test_field_errors_name_file_line_and_field(tmp_path, line, field, text):
    path = _write(tmp_path, _line(id="fine"), line)
    with pytest.raises(SpecError) as raised:
        read_dataset(path)
    problem = raised.value.problems[0]
    assert problem.location.file == str(path) and problem.location.line == 2
    assert str(raised.value).startswith(f"{path}:2:1: {field}: ")
    assert text in str(raised.value)
    assert problem.code == "E_FIELD" and problem.fix


def test_all_problems_of_a_file_are_reported_together(tmp_path):
    path = _write(tmp_path, _line(question=""), _line(answers=[]), _line(id="ok"))
    with pytest.raises(SpecError) as raised:
        read_dataset(path)
    assert [p.location.line for p in raised.value.problems] == [1, 2]


@pytest.mark.parametrize(
    ("content", "code", "text", "line"),
    [
        (b'{"documents": ["a"], "question": "q", "answers": ["x"]\n', "E_FIELD", "not valid JSON", 1),
        (b"[1, 2]\n", "E_FIELD", "expected a JSON object, found a list", 1),
        (b'{"documents": ["a"], "question": "q", "answers": ["x"], "id": "a"}\n{"documents": ["\xff"]}\n', "E_ENCODING", "0xff", 2),
        (b"", "E_FIELD", "holds no cases", 1),
        (b"\n\n", "E_FIELD", "holds no cases", 1),
    ],
)
def test_file_level_errors(tmp_path, content, code, text, line):
    path = tmp_path / "d.jsonl"
    path.write_bytes(content)
    with pytest.raises(SpecError) as raised:
        read_dataset(path)
    assert raised.value.code == code and text in str(raised.value)
    assert raised.value.location.line == line


def test_duplicate_ids_missing_files_and_directories(tmp_path):
    with pytest.raises(SpecError, match="already used on line 1") as raised:
        read_dataset(_write(tmp_path, _line(id="a"), _line(id="a")))
    assert raised.value.code == "E_DUPLICATE_NAME"
    with pytest.raises(SpecError, match="identical cases"):  # no ids, same content
        read_dataset(_write(tmp_path, _line(), _line(), name="same.jsonl"))
    with pytest.raises(SpecError, match="file not found") as raised:
        read_dataset(tmp_path / "missing.jsonl")
    assert raised.value.code == "E_FILE"
    with pytest.raises(SpecError, match="not a regular file"):
        read_dataset(tmp_path)


def test_huge_files_and_lines_are_refused_clearly(tmp_path):
    path = _write(tmp_path, _line(id="a"), _line(id="b"))
    with pytest.raises(SpecError, match="more than the 10-byte limit") as raised:
        read_dataset(path, max_bytes=10)
    assert raised.value.code == "E_FILE_SIZE" and "--limit" in raised.value.fix
    assert len(read_dataset(path, max_bytes=10, limit=1)) == 1  # with a limit only the head is read
    long_line = _line(id="c", documents=["x" * 5000])
    with pytest.raises(SpecError, match="longer than 1000 bytes") as raised:
        read_dataset(_write(tmp_path, _line(id="a"), long_line, name="long.jsonl"), max_line_bytes=1000)
    assert raised.value.location.line == 2
    with pytest.raises(ValueError, match="limit"):
        read_dataset(path, limit=0)


def test_make_case_and_write_jsonl_check_like_reading(tmp_path):
    case = make_case(documents=["a b"], question="q?", answers=["b"], gold_document=0, evidence="a b")
    assert isinstance(case, Case) and case.gold_text == "a b" and case.id.startswith("sha-")
    with pytest.raises(SpecError, match="gold_document"):
        make_case(documents=["a"], question="q", answers=["a"], gold_document=1)
    with pytest.raises(SpecError, match="answers"):
        write_jsonl(tmp_path / "x.jsonl", [{"documents": ["a"], "question": "q", "answers": []}])
    assert not (tmp_path / "x.jsonl").exists()  # nothing written when a case is bad
    with pytest.raises(ValueError, match=r"cases\[0\]"):
        write_jsonl(tmp_path / "x.jsonl", [{"documents": ["a"], "question": "q", "answers": ["a"], "bogus": 1}])


def test_synthetic_is_deterministic_and_well_formed(tmp_path):
    first, second = make_dataset(30, seed=7, documents=4), make_dataset(30, seed=7, documents=4)
    assert [c.as_json() for c in first] == [c.as_json() for c in second]
    assert [c.as_json() for c in make_dataset(30, seed=8, documents=4)] != [c.as_json() for c in first]
    for case in first:
        assert len(case.documents) == 4
        gold = case.documents[case.gold_document]
        assert gold.count(case.evidence) == 1
        assert sum(document.count(case.evidence) for document in case.documents) == 1
        assert case.answers[0] in case.evidence and case.answers[0] not in case.question
        entity = case.meta["entity"]
        assert sum(document.count(f"The {entity} project") for document in case.documents) == 1
    written = write_dataset(tmp_path / "syn.jsonl", 12, seed=1, documents=4)
    assert written == 12 and len(read_dataset(tmp_path / "syn.jsonl")) == 12


def test_synthetic_places_the_answer_without_bias():
    cases = make_dataset(1200, seed=0, documents=4)
    gold = Counter(case.gold_document for case in cases)
    assert set(gold) == {0, 1, 2, 3} and min(gold.values()) > 240  # 300 expected each
    relations = Counter(case.meta["relation"] for case in cases)
    assert min(relations.values()) > 340  # 400 expected each
    # where the evidence sentence sits among its document's 8 sentences is uniform too
    places = Counter()
    for case in cases:
        sentences = case.documents[case.gold_document].split(". ")
        assert len(sentences) == 8
        places[next(i for i, s in enumerate(sentences) if s.rstrip(".") == case.evidence.rstrip("."))] += 1
    assert set(places) == set(range(8)) and 110 < min(places.values()) and max(places.values()) < 190  # 150 each


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"size": 0}, "size"), ({"size": 2, "documents": 0}, "documents"), ({"size": 2, "seed": -1}, "seed"),
     ({"size": 2, "filler_per_document": 99}, "filler_per_document"), ({"size": 2, "documents": 10}, "documents x")],
)
def test_synthetic_rejects_bad_sizes(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_dataset(**kwargs)


def test_long_documents_have_the_asked_length_and_count():
    from rclc_graph.experiments.synthetic import pieces

    cases = make_dataset(40, seed=3, documents=(4, 8), document_tokens=(300, 600))
    assert [c.as_json() for c in cases] == [c.as_json() for c in make_dataset(40, seed=3, documents=(4, 8), document_tokens=(300, 600))]
    counts = Counter(len(case.documents) for case in cases)
    assert set(counts) <= set(range(4, 9)) and len(counts) >= 3
    for case in cases:
        assert sum(document.count(case.evidence) for document in case.documents) == 1
        assert case.evidence in case.documents[case.gold_document]
        assert case.answers[0] not in case.question
        entity = case.meta["entity"]
        assert sum(document.count(f"The {entity} project") for document in case.documents) == 1
        for document in case.documents:
            # filled up to the drawn target: at most one filler sentence (<= 20 pieces) short of it
            assert 280 <= pieces(document) <= 600
            assert "\n\n" in document  # paragraphs
    # the short form's draws did not change: documents=N without document_tokens as before
    assert [len(c.documents) for c in make_dataset(5, seed=3, documents=4)] == [4] * 5


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"documents": (4, 8)}, "needs document_tokens"),
     ({"documents": (5, 4), "document_tokens": (300, 600)}, "documents"),
     ({"documents": (4, 8), "document_tokens": (600, 300)}, "document_tokens"),
     ({"documents": 4, "document_tokens": (10, 20)}, "cannot hold"),
     ({"documents": (4, 20), "document_tokens": (300, 600)}, "distinct entities")],
)
def test_long_documents_reject_bad_ranges(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_dataset(3, **kwargs)


# issue 24 item 5: a dataset row with a lone surrogate raised UnicodeEncodeError without file and line
def test_a_lone_surrogate_in_a_row_is_named_with_file_line_and_field(tmp_path):
    path = tmp_path / "cases.jsonl"
    good = {"documents": ["The Cedar project is owned by Alice."], "question": "Who owns Cedar?", "answers": ["Alice"]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "documents": ["ok", "bad \ud800 text"]}) + "\n",
                    encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        read_dataset(path)
    (problem,) = caught.value.problems
    assert problem.code == "E_ENCODING" and problem.path == ("documents", 1)
    assert problem.location.file == str(path) and problem.location.line == 2


def test_evidence_from_several_documents(tmp_path):
    """A two-hop case lists its gold documents and one evidence sentence each."""
    documents = ["The Cedar lab is owned by Ann Lee. Filler.", "Filler. Ann Lee lives in Oslo."]
    case = make_case(documents=documents, question="Where does the owner of the Cedar lab live?", answers=["Oslo"],
                     gold_document=[0, 1], evidence=["The Cedar lab is owned by Ann Lee.", "Ann Lee lives in Oslo."])
    assert case.gold_document == (0, 1) and case.gold_text is None
    assert case.evidence_items() == [(documents[0], "The Cedar lab is owned by Ann Lee."), (documents[1], "Ann Lee lives in Oslo.")]
    path = tmp_path / "two.jsonl"
    write_jsonl(path, [case])
    assert read_dataset(path)[0] == case and '"gold_document": [0, 1]' in path.read_text()
    single = make_case(documents=documents, question="q", answers=["Oslo"], gold_document=1, evidence="Ann Lee lives in Oslo.")
    assert single.evidence_items() == [(documents[1], "Ann Lee lives in Oslo.")] and single.gold_text == documents[1]
    for gold, evidence, message in [
        ([0, 1], "Ann Lee lives in Oslo.", "must list one sentence each"),
        ([0, 1], ["Ann Lee lives in Oslo."], "one sentence per gold document"),
        ([0, 0], ["x", "y"], "distinct document indices"),
        ([0, 5], ["x", "y"], "outside the 2 documents"),
        ([1, 0], ["The Cedar lab is owned by Ann Lee.", "Ann Lee lives in Oslo."], "verbatim in documents\\[1\\]"),
        (None, ["The Cedar lab is owned by Ann Lee.", "Nowhere."], "not occur verbatim in any document"),
    ]:
        with pytest.raises(ValueError, match=message):
            make_case(documents=documents, question="q", answers=["Oslo"], gold_document=gold, evidence=evidence)
