"""Task families: seeded generators of multi-document question cases, each testing one
property real corpora have (docs/experiments.md#task-families says what and why).

    make_family("profiles", 80, seed=3, documents=4)   # -> list[Case]

| family | what the answer needs |
| --- | --- |
| `single-fact` | the one sentence naming the asked entity (the project's first generator, `synthetic.py`) |
| `profiles` | the sentence naming both the asked organisation and the asked relation, among its other facts and rivals' facts of that relation |
| `paraphrase` | the same, with a question that shares no content word with its evidence |
| `two-hop` | two facts from two documents, one of which the question names only through the other |
| `long` | any of the above, with documents of 300-600 word pieces |

Every case is drawn from its own generator seeded with (family, seed, index), so case i of
a seed is the same whatever the size, and the seeds of a dev split and a test split never
share a case. Nothing is tuned to favour any handoff policy: subjects, relations, wordings,
the gold document and the evidence's place are drawn uniformly.
"""

from __future__ import annotations

import random
from typing import Callable

from ...errors import UsageError
from .. import synthetic
from ..datasets import Case
from .drafts import Draft
from .long import BASES, lengthen
from .paraphrase import draw_paraphrase
from .profiles import draw_profiles
from .two_hop import draw_two_hop

FAMILIES = ("single-fact", "profiles", "paraphrase", "two-hop", "long")
DEFAULT_DOCUMENT_TOKENS = (300, 600)
MAX_DOCUMENTS = 10
_DRAW: dict[str, Callable[[random.Random, int], Draft]] = {
    "profiles": draw_profiles, "paraphrase": draw_paraphrase, "two-hop": draw_two_hop,
}
_LEAST_DOCUMENTS = {"two-hop": 2}


def case_rng(family: str, seed: int, index: int) -> random.Random:
    """The generator of one case (str seeds hash the same way on every machine and run)."""
    return random.Random(f"{family}/{seed}/{index}")


def draw_family_case(family: str, seed: int, index: int, documents: int, *, within: str = "") -> Case:
    """Case `index` of `family` (not `long`, not `single-fact`) for `seed`; `within` names
    the family drawing it as its base (so a long case never repeats a case of its base)."""
    rng = case_rng(f"{within}:{family}" if within else family, seed, index)
    return _DRAW[family](rng, documents).to_case(f"{family}-{seed}-{index:05d}", rng)


def _base_case(base: str, seed: int, index: int, documents: int, rng: random.Random) -> Case:
    if base == "single-fact":
        facts = min(4, len(synthetic.ENTITIES) // documents)
        case = synthetic.draw_case(rng, index, documents=documents, facts_per_document=facts, filler_per_document=0)
        return case
    return draw_family_case(base, seed, index, documents, within="long")


def draw_long_case(seed: int, index: int, documents: tuple[int, int], tokens: tuple[int, int]) -> Case:
    """Case `index` of the `long` family: a base family drawn per case, then lengthened."""
    rng = case_rng("long", seed, index)
    base = rng.choice(BASES)
    count = rng.randint(max(documents[0], _LEAST_DOCUMENTS.get(base, 1)), max(documents))
    case = _base_case(base, seed, index, count, rng)
    lengthened = lengthen(case, rng, tokens)
    meta = {**lengthened.meta, "base_family": base, "documents": count}
    return Case(f"long-{seed}-{index:05d}", lengthened.documents, lengthened.question, lengthened.answers,
                lengthened.gold_document, lengthened.evidence, meta)


def make_family(
    family: str,
    size: int,
    *,
    seed: int = 0,
    documents: int | tuple[int, int] = 3,
    document_tokens: tuple[int, int] | None = None,
) -> list[Case]:
    """`size` cases of `family` drawn from `seed` (module docstring). `documents` is a count,
    or for `long` a (low, high) range drawn per case; `document_tokens` (a (low, high) range
    of word pieces) is `long`'s document length (default 300-600). `single-fact` is
    `synthetic.make_dataset` (more options there)."""
    if family not in FAMILIES:
        raise UsageError(f"family: {family!r} is not one of {', '.join(FAMILIES)}")
    for name, value, least in (("size", size, 1), ("seed", seed, 0)):
        if type(value) is not int or value < least:
            raise UsageError(f"{name}: expected a whole number >= {least}, got {value!r}")
    low, high = synthetic._span("documents", documents, 1)
    if high > MAX_DOCUMENTS and family != "single-fact":
        raise UsageError(f"documents: at most {MAX_DOCUMENTS} documents per case (the pools of names are sized for it)")
    if family == "single-fact":
        return synthetic.make_dataset(size, seed=seed, documents=documents, document_tokens=document_tokens)
    if family == "long":
        tokens = synthetic._span("document_tokens", document_tokens or DEFAULT_DOCUMENT_TOKENS, 1)
        if high < 2:
            raise UsageError("documents: the long family draws two-hop cases too, which need at least 2 documents")
        return [draw_long_case(seed, index, (low, high), tokens) for index in range(size)]
    if document_tokens is not None:
        raise UsageError(f"document_tokens: only the long and single-fact families take it, not {family!r}")
    if low != high:
        raise UsageError(f"documents: {family} takes one number of documents per case (a range is for long)")
    if low < _LEAST_DOCUMENTS.get(family, 1):
        raise UsageError(f"documents: {family} needs at least {_LEAST_DOCUMENTS[family]} documents per case")
    return [draw_family_case(family, seed, index, low) for index in range(size)]
