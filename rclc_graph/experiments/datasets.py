"""JSONL datasets of multi-document questions: reading with precise errors, and writing.

One case per line, a JSON object:

    {"id": "q1",                              optional; a string, unique in the file
     "documents": ["...", "..."],             required; non-empty list of non-empty strings
     "question": "...",                       required; non-empty string
     "answers": ["Oslo"],                     required; non-empty list of accepted answers
     "gold_document": 0,                      optional; index of the document holding the answer
     "evidence": "The X project is ...",      optional; the gold sentence, verbatim in a document
     (or, when the answer needs facts from several documents: "gold_document": [0, 2] and
     "evidence": ["first fact ...", "second fact ..."], one sentence per listed document)
     "meta": {...}}                           optional; free JSON, carried along untouched

Blank (whitespace-only) lines are skipped. Unknown fields are errors (a typo such as
`answer` for `answers` would otherwise make every case unscorable). A case without `id`
gets one derived from its content (`sha-` + 12 hex digits), so an id survives reordering
the file and results of a resumed experiment stay attached to the right case.

Files are streamed line by line, so a huge file costs memory for the cases actually kept
(`limit` stops reading early); `max_bytes` and `max_line_bytes` refuse files and lines that
are larger than anything sensible with a clear error instead of exhausting memory. Errors are
`SpecError`s (see rclc_graph.errors): every problem names the file, the line and the field,
with a stable code and a fix; all problems of a file (up to `MAX_PROBLEMS`) are reported at once.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from rclc.files import write_atomic

from ..errors import FieldPath, Location, Problem, SpecError, UsageError
from ..plan.text_checks import surrogate_paths
from ..spec.bounded_json import JSONLimitError, loads
from .scoring import normalise

DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB
DEFAULT_MAX_LINE_BYTES = 64 << 20  # 64 MiB per case
MAX_PROBLEMS = 20
FIELDS = ("id", "documents", "question", "answers", "gold_document", "evidence", "meta")
REQUIRED = ("documents", "question", "answers")


@dataclass(frozen=True)
class Case:
    """One question over several documents, with the answers a scorer accepts.

    `gold_document` (index into `documents`) and `evidence` (the sentence that answers the
    question, verbatim inside the gold document) are optional; with them an experiment can
    measure how much of the evidence survives each handoff. An answer that needs facts from
    several documents (a two-hop question) lists them: `gold_document` a tuple of indices and
    `evidence` a tuple of as many sentences, `evidence[i]` inside `documents[gold_document[i]]`.
    """

    id: str
    documents: tuple[str, ...]
    question: str
    answers: tuple[str, ...]
    gold_document: int | tuple[int, ...] | None = None
    evidence: str | tuple[str, ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "documents": list(self.documents),
            "question": self.question,
            "answers": list(self.answers),
        }
        if self.gold_document is not None:
            data["gold_document"] = _plain(self.gold_document)
        if self.evidence is not None:
            data["evidence"] = _plain(self.evidence)
        if self.meta:
            data["meta"] = dict(self.meta)
        return data

    def fingerprint(self) -> str:
        """sha256 of the case's content (meta excluded): a stored result row names it, so a
        resumed experiment refuses rows computed for a case that has since changed."""
        return _content_hash(self.documents, self.question, self.answers, _plain(self.gold_document), _plain(self.evidence))

    @property
    def gold_text(self) -> str | None:
        """The gold document's text (None without one, or when the answer needs several)."""
        return self.documents[self.gold_document] if type(self.gold_document) is int else None

    def evidence_items(self) -> list[tuple[str | None, str | None]]:
        """(gold document text, evidence sentence) per fact the answer needs: one pair for a
        single gold document, one per listed document otherwise; [] when neither is known.
        Either side may be None (a document without its sentence, a sentence without its
        document)."""
        if isinstance(self.gold_document, tuple):
            sentences = self.evidence if isinstance(self.evidence, tuple) else (None,) * len(self.gold_document)
            return [(self.documents[index], sentence) for index, sentence in zip(self.gold_document, sentences)]
        if isinstance(self.evidence, tuple):
            return [(None, sentence) for sentence in self.evidence]
        if self.gold_document is None and self.evidence is None:
            return []
        return [(self.gold_text, self.evidence)]


def make_case(
    *,
    documents: Sequence[str],
    question: str,
    answers: Sequence[str],
    id: str | None = None,  # noqa: A002 - the dataset field's name
    gold_document: int | Sequence[int] | None = None,
    evidence: str | Sequence[str] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Case:
    """A checked `Case` (the same checks as a JSONL line); ValueError names the field."""
    data: dict[str, Any] = {"documents": list(documents), "question": question, "answers": list(answers)}
    for name, value in (("id", id), ("gold_document", gold_document), ("evidence", evidence), ("meta", meta)):
        if value is not None:
            data[name] = dict(value) if name == "meta" else list(value) if isinstance(value, tuple) else value
    problems: list[Problem] = []
    case = _case_from(data, problems, None)
    if problems:
        raise SpecError(problems)
    assert case is not None
    return case


def read_dataset(
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> list[Case]:
    """The cases of a JSONL file, in file order (the first `limit` when given)."""
    if limit is not None and (type(limit) is not int or limit < 1):
        raise UsageError(f"limit: expected a whole number >= 1 or None, got {limit!r}")
    file = str(path)
    handle = _open(file, None if limit is not None else max_bytes)  # with a limit, only the head is read
    cases: list[Case] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    with handle:
        line_number = 0
        while limit is None or len(cases) < limit:
            raw = handle.readline(max_line_bytes + 1)
            if not raw:
                break
            line_number += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                problems.append(
                    Problem(
                        "E_FILE_SIZE",
                        f"line is longer than {max_line_bytes} bytes",
                        "split the case's documents, or raise max_line_bytes",
                        location=Location(file, line_number),
                    )
                )
                break  # the rest of this line would be read as further lines
            case = _parse_line(raw, file, line_number, problems)
            if case is None:
                if len(problems) >= MAX_PROBLEMS:
                    break
                continue
            if case.id in seen:
                problems.append(
                    Problem(
                        "E_DUPLICATE_NAME",
                        f"case id {case.id!r} already used on line {seen[case.id]}",
                        "give every case a distinct id (two identical cases without ids also collide)",
                        ("id",),
                        Location(file, line_number),
                    )
                )
                continue
            seen[case.id] = line_number
            cases.append(case)
    if problems:
        raise SpecError(problems[:MAX_PROBLEMS])
    if not cases:
        raise SpecError.one("E_FIELD", "the dataset holds no cases", "write one JSON object per line", location=Location(file, 1))
    return cases


def write_jsonl(path: str | os.PathLike[str], cases: Iterable[Case | Mapping[str, Any]]) -> int:
    """Write cases as UTF-8 JSONL (atomically: a crash leaves the old file or the new one);
    returns the number of lines written. Mappings are checked like lines being read."""
    target = Path(path)
    rows = []
    for index, case in enumerate(cases):
        if not isinstance(case, Case):
            try:
                case = make_case(**dict(case))
            except TypeError as exc:
                raise UsageError(f"cases[{index}]: {exc}") from None
        rows.append(json.dumps(case.as_json(), ensure_ascii=False))
    write_atomic(target, "".join(row + "\n" for row in rows).encode("utf-8"))
    return len(rows)


# -- internals -------------------------------------------------------------------------------


def _open(file: str, max_bytes: int | None):
    where = Location(file, 1)
    try:
        if not Path(file).is_file():
            if not Path(file).exists():
                raise SpecError.one("E_FILE", "file not found", "check the path of the JSONL dataset", location=where)
            raise SpecError.one("E_FILE", "not a regular file", "give the path of a JSONL file", location=where)
        size = os.stat(file).st_size
        if max_bytes is not None and size > max_bytes:
            raise SpecError.one(
                "E_FILE_SIZE",
                f"file is {size} bytes, more than the {max_bytes}-byte limit",
                "use --limit with a smaller file, split the dataset, or raise max_bytes",
                location=where,
            )
        return open(file, "rb")
    except SpecError:
        raise
    except OSError as exc:
        raise SpecError.one("E_FILE", f"cannot read file ({exc.strerror or exc})", "check the path and permissions", location=where) from None


def _parse_line(raw: bytes, file: str, line_number: int, problems: list[Problem]) -> Case | None:
    if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append(
            Problem(
                "E_ENCODING",
                f"byte 0x{raw[exc.start]:02x} is not valid UTF-8",
                "save the file as UTF-8",
                location=Location(file, line_number, exc.start + 1),
            )
        )
        return None
    if not text.strip():
        return None
    try:
        data = loads(text)
    except json.JSONDecodeError as exc:
        problems.append(
            Problem(
                "E_FIELD",
                f"not valid JSON ({exc.msg})",
                "write one complete JSON object per line",
                location=Location(file, line_number, exc.colno),
            )
        )
        return None
    except JSONLimitError as exc:
        problems.append(Problem("E_TOO_DEEP" if "nested" in str(exc) else "E_FIELD", str(exc),
                                "write one flat JSON object per line, each key once", location=Location(file, line_number)))
        return None
    broken = surrogate_paths(data)
    if broken:  # JSON's "\ud800": hashing the case for its id raised UnicodeEncodeError, without file or line
        problems.extend(Problem("E_ENCODING", "the text holds a lone surrogate (half of a UTF-16 character)",
                                "write the whole character (both halves of the escape), or remove it", path,
                                Location(file, line_number)) for path in broken)
        return None
    if not isinstance(data, dict):
        problems.append(
            Problem(
                "E_FIELD",
                f"expected a JSON object, found {_json_kind(data)}",
                'write {"documents": [...], "question": "...", "answers": [...]}',
                location=Location(file, line_number),
            )
        )
        return None
    return _case_from(data, problems, Location(file, line_number))


def _case_from(data: dict[str, Any], problems: list[Problem], where: Location | None) -> Case | None:
    found: list[Problem] = []

    def bad(path: FieldPath, message: str, fix: str, code: str = "E_FIELD") -> None:
        found.append(Problem(code, message, fix, path, where))

    for name in data:
        if name not in FIELDS:
            close = difflib.get_close_matches(str(name), FIELDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            bad((name,), f"unknown field {name!r}", f"{hint}allowed fields: {', '.join(FIELDS)} (put extras under meta)")
    for name in REQUIRED:
        if name not in data:
            bad((name,), f"required field {name!r} is missing", f"add {name!r}")

    documents = data.get("documents")
    if "documents" in data:
        if not isinstance(documents, list) or not documents:
            bad(("documents",), f"expected a non-empty list of strings, found {_json_kind(documents)}", 'write "documents": ["first text", "second text"]')
            documents = None
        else:
            for index, document in enumerate(documents):
                if not isinstance(document, str) or not document.strip():
                    what = "an empty string" if isinstance(document, str) else _json_kind(document)
                    bad(("documents", index), f"expected non-empty text, found {what}", "remove the entry or give it text")
                    documents = None
    question = data.get("question")
    if "question" in data and (not isinstance(question, str) or not question.strip()):
        bad(("question",), f"expected non-empty text, found {_json_kind(question)}", 'write "question": "..."')
    answers = data.get("answers")
    if "answers" in data:
        if isinstance(answers, str):
            bad(("answers",), "expected a list of accepted answers, found a string", f'write "answers": [{json.dumps(answers)}]')
        elif not isinstance(answers, list) or not answers:
            bad(("answers",), f"expected a non-empty list of strings, found {_json_kind(answers)}", 'write "answers": ["accepted answer"]')
        else:
            for index, answer in enumerate(answers):
                if not isinstance(answer, str):
                    bad(("answers", index), f"expected text, found {_json_kind(answer)}", "quote the answer")
                elif not normalise(answer):
                    bad(
                        ("answers", index),
                        f"answer {answer!r} is empty once case and punctuation are dropped, so every output would contain it",
                        "give an answer with at least one letter or digit",
                    )
    case_id = data.get("id")
    if "id" in data and (not isinstance(case_id, str) or not case_id.strip() or case_id != case_id.strip()):
        bad(("id",), f"expected non-empty text without surrounding spaces, found {_json_kind(case_id)}", 'write "id": "q1" (or drop it)')
    gold = data.get("gold_document")
    if "gold_document" in data and gold is not None:
        gold = _check_gold(gold, documents, bad)
    evidence = data.get("evidence")
    if "evidence" in data and evidence is not None:
        evidence = _check_evidence(evidence, gold, documents if not found else None, bad)
    meta = data.get("meta")
    if "meta" in data and not isinstance(meta, dict):
        bad(("meta",), f"expected a JSON object, found {_json_kind(meta)}", 'write "meta": {...} or drop it')

    if found:
        problems.extend(found)
        return None
    documents_t = tuple(documents)  # type: ignore[arg-type]
    answers_t = tuple(answers)  # type: ignore[arg-type]
    gold_t = tuple(gold) if isinstance(gold, list) else gold if type(gold) is int else None
    evidence_t = tuple(evidence) if isinstance(evidence, list) else evidence if isinstance(evidence, str) else None
    if case_id is None:
        case_id = "sha-" + _content_hash(documents_t, question, answers_t, _plain(gold_t), _plain(evidence_t))[:12]
    return Case(case_id, documents_t, question, answers_t, gold_t, evidence_t, dict(meta or {}))


def _check_gold(gold: Any, documents: Any, bad: Any) -> Any:
    """`gold_document`: an index, or a non-empty list of distinct indices (facts from several
    documents); returns it, or None after reporting what is wrong."""
    listed = gold if isinstance(gold, list) else [gold]
    if isinstance(gold, list) and (not gold or len(set(map(repr, gold))) != len(gold)):
        bad(("gold_document",), "expected a non-empty list of distinct document indices",
            "write one index, or [i, j] when the answer needs facts from several documents")
        return None
    for index in listed:
        if type(index) is not int:
            bad(("gold_document",), f"expected a document index (whole number), found {_json_kind(index)}", "write the 0-based index of the gold document")
            return None
        if isinstance(documents, list) and not 0 <= index < len(documents):
            bad(("gold_document",), f"index {index} is outside the {len(documents)} documents", f"use 0..{len(documents) - 1}")
            return None
    return gold


def _check_evidence(evidence: Any, gold: Any, documents: Any, bad: Any) -> Any:
    """`evidence`: a sentence, or (with a list of gold documents) one sentence per listed
    document, each verbatim in its document; returns it, or None after reporting."""
    if isinstance(gold, list) and not isinstance(evidence, list):
        bad(("evidence",), f"gold_document lists {len(gold)} documents, so evidence must list one sentence each",
            'write "evidence": ["...", "..."], one sentence per gold document, in the same order')
        return None
    sentences = evidence if isinstance(evidence, list) else [evidence]
    if isinstance(evidence, list) and (not evidence or (isinstance(gold, list) and len(evidence) != len(gold))):
        bad(("evidence",), f"expected one sentence per gold document ({len(gold) if isinstance(gold, list) else 'a non-empty list'}), "
            f"found {len(evidence)}", "list the evidence sentences in the order of gold_document")
        return None
    for index, sentence in enumerate(sentences):
        path = ("evidence", index) if isinstance(evidence, list) else ("evidence",)
        if not isinstance(sentence, str) or not sentence.strip():
            bad(path, f"expected non-empty text, found {_json_kind(sentence)}", "give the gold sentence, or drop evidence")
            return None
        if not isinstance(documents, list):
            continue
        holders = [number for number, document in enumerate(documents) if sentence in document]
        expected = gold[index] if isinstance(gold, list) else gold
        if type(expected) is int and expected not in holders:
            bad(path, f"the evidence does not occur verbatim in documents[{expected}] (the gold document)", "copy the sentence exactly from the gold document")
            return None
        if not holders:
            bad(path, "the evidence does not occur verbatim in any document", "copy the sentence exactly from a document")
            return None
    return evidence


def _plain(value: Any) -> Any:
    """A gold index or evidence value as JSON writes it (tuples as lists)."""
    return list(value) if isinstance(value, tuple) else value


def _content_hash(documents, question, answers, gold, evidence) -> str:
    payload = {"documents": list(documents), "question": question, "answers": list(answers), "gold_document": gold, "evidence": evidence}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if not value.strip() else "a string"
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
