"""Family `paraphrase`: the question is worded differently from the sentence that answers it.

What it tests: the question and its evidence sentence share no content word besides the
organisation's name and kind (no stem in common, `lexical.shared_stems`): the documents say
"The Cedar lab is owned by Alice Moreno." or "Alice Moreno owns the Cedar lab.", the
question asks "Whose property is the Cedar lab?" or "Who holds the title to the Cedar lab?";
"was founded in" is asked as "When was it set up?", "employs 40 people" as "What is the
headcount?". Synonyms, other verb forms and other clause orders. A selection that relies on
the question's words reaching the evidence's words finds only the organisation's name, which
the organisation's other facts share. Documents are shaped as in `profiles`, with 1 to 3
facts per organisation.

Why real corpora have it: people ask in their own words, not in the document's; the same
fact is written many ways ("belongs to", "owned by", "the proprietor of").
"""

from __future__ import annotations

import random

from .drafts import Draft
from .facts import Fact, fill
from .lexical import shared_stems
from .profiles import profile_case


def paraphrased_question(fact: Fact, evidence: str, rng: random.Random) -> str | None:
    """A paraphrase of the question about `fact` sharing no content stem with `evidence`
    (besides the subject's name and kind), or None when none of the relation's paraphrases does."""
    forms = list(fact.relation.paraphrases)
    rng.shuffle(forms)
    for form in forms:
        question = fill(form, fact.subject)
        if not shared_stems(question, evidence, ignore=fact.subject.phrase):
            return question
    return None


def draw_paraphrase(rng: random.Random, documents: int) -> Draft:
    """A `paraphrase` case (module docstring)."""
    draft = profile_case(rng, documents, facts=(1, 3), question=lambda fact, text: paraphrased_question(fact, text, rng))
    return draft
