"""Relations the task families state and ask about, each with many surface forms.

The wordings are data, in `words.yaml` beside this module (read once, `vocabulary.words`).
A relation links a subject (an organisation or a person) to a value. Each one has:

- `statements`: whole sentences stating it, in several wordings and clause orders
  ("The Cedar lab is owned by Alice Moreno." / "Alice Moreno owns the Cedar lab.");
- `predicates`: subject-first verb phrases, so two facts of one subject can share a sentence
  ("The Cedar lab is based in Oslo and was founded in 1982.");
- `questions`: plain questions that reuse the relation's words ("Who owns the Cedar lab?");
- `paraphrases`: questions worded differently (synonyms, other verb forms: "Whose property
  is the Cedar lab?"), for the paraphrase family, which pairs each with a statement it
  shares no content word with (`lexical.py`);
- `roles` (organisation -> person relations): noun phrases that name the person through the
  organisation ("the owner of the Cedar lab"), for two-hop questions.

Templates use `{S}`/`{s}` for the subject at the start of / inside a sentence and `{V}`/`{v}`
for the value likewise. Several relations share a value kind (owner and head are both
people; base city, home city and place of study are all cities; founding and birth years
are both years), so the kind of answer alone never tells which fact is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from .vocabulary import pool


@dataclass(frozen=True)
class Relation:
    """One relation and its wordings (module docstring)."""

    name: str
    subject: str  # "org" or "person"
    value: str  # "person", "city", "year", "count" or "product"
    statements: tuple[str, ...]
    predicates: tuple[str, ...]
    questions: tuple[str, ...]
    paraphrases: tuple[str, ...]
    roles: tuple[str, ...] = ()


def _relations(group: str) -> dict[str, Relation]:
    """The relations of `words.yaml`'s `group`, by name, each field a tuple."""
    found = {}
    for entry in pool(group):
        fields = {key: tuple(value) if isinstance(value, list) else value for key, value in entry.items()}
        found[fields["name"]] = Relation(**fields)
    return found


ORG_RELATIONS: dict[str, Relation] = _relations("org_relations")
"""Facts about organisations."""

PERSON_RELATIONS: dict[str, Relation] = _relations("person_relations")
"""Facts about people (the second hop of two-hop questions, and their distractors)."""

BRIDGES: tuple[str, ...] = pool("bridges")
"""Organisation -> person relations a two-hop question can go through."""
