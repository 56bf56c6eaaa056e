"""Relations the task families state and ask about, each with many surface forms.

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


ORG_RELATIONS: dict[str, Relation] = {
    relation.name: relation
    for relation in (
        Relation(
            "owner", "org", "person",
            statements=("{S} is owned by {v}.", "{V} owns {s}.", "{S} belongs to {v}.", "The owner of {s} is {v}.",
                        "{S} has been owned by {v} since its early days.", "{V} is the owner of {s}.",
                        "Ownership of {s} lies with {v}."),
            predicates=("is owned by {v}", "belongs to {v}", "has been owned by {v} for years"),
            questions=("Who owns {s}?", "Who is the owner of {s}?"),
            paraphrases=("Whose property is {s}?", "Who holds the title to {s}?", "Who is the proprietor of {s}?",
                         "To whom does {s} belong?"),
            roles=("the owner of {s}", "the person who owns {s}"),
        ),
        Relation(
            "head", "org", "person",
            statements=("{S} is led by {v}.", "{V} leads {s}.", "{V} runs {s}.", "{S} is run by {v}.",
                        "The head of {s} is {v}.", "{V} directs {s}.", "{S} is managed by {v}."),
            predicates=("is led by {v}", "is run by {v}", "is managed by {v}"),
            questions=("Who leads {s}?", "Who runs {s}?", "Who is the head of {s}?"),
            paraphrases=("Who is in charge of {s}?", "Who heads {s}?", "Who is the director of {s}?",
                         "Who manages {s}?", "Who is the boss at {s}?"),
            roles=("the head of {s}", "the person who leads {s}"),
        ),
        Relation(
            "city", "org", "city",
            statements=("{S} is based in {v}.", "{S} has its offices in {v}.", "{S} operates from {v}.",
                        "{S} is located in {v}.", "The headquarters of {s} are in {v}.", "{V} is home to {s}.",
                        "{S} works out of {v}."),
            predicates=("is based in {v}", "has its offices in {v}", "operates from {v}"),
            questions=("In which city is {s} based?", "Where is {s} based?"),
            paraphrases=("Where is {s} located?", "Which city hosts {s}?", "In what town does {s} have its headquarters?",
                         "Where can the offices of {s} be found?", "In which city does {s} operate?"),
        ),
        Relation(
            "founded", "org", "year",
            statements=("{S} was founded in {v}.", "{S} was established in {v}.", "{S} was started in {v}.",
                        "{S} dates back to {v}.", "In {v}, {s} was founded.", "{S} opened in {v}.",
                        "{S} has existed since {v}."),
            predicates=("was founded in {v}", "was established in {v}", "opened in {v}"),
            questions=("In which year was {s} founded?", "When was {s} founded?"),
            paraphrases=("When was {s} established?", "What year did {s} start?", "When did {s} begin?",
                         "In what year did {s} open its doors?", "Since which year has {s} existed?",
                         "When was {s} set up?"),
        ),
        Relation(
            "staff", "org", "count",
            statements=("{S} employs {v} people.", "{S} has a staff of {v}.", "{V} people work for {s}.",
                        "{S} has {v} employees.", "The team at {s} numbers {v}.", "{S} has a workforce of {v}."),
            predicates=("employs {v} people", "has a staff of {v}", "has {v} employees"),
            questions=("How many people does {s} employ?", "How many people work for {s}?"),
            paraphrases=("How large is the workforce of {s}?", "How big is the team at {s}?",
                         "How many workers does {s} have?", "What is the headcount of {s}?",
                         "How many employees does {s} have?", "What is the size of the staff at {s}?"),
        ),
        Relation(
            "product", "org", "product",
            statements=("{S} makes {v}.", "{S} produces {v}.", "{S} is known for its {v}.", "{S} sells {v}.",
                        "{V} are made by {s}.", "The main products of {s} are {v}.", "{S} builds {v}."),
            predicates=("makes {v}", "produces {v}", "sells {v}"),
            questions=("What does {s} make?", "What does {s} produce?"),
            paraphrases=("What goods come from {s}?", "What is manufactured by {s}?", "What does {s} sell?",
                         "What items does {s} build?", "What products does {s} offer?", "What does {s} turn out?"),
        ),
    )
}
"""Facts about organisations."""

PERSON_RELATIONS: dict[str, Relation] = {
    relation.name: relation
    for relation in (
        Relation(
            "home", "person", "city",
            statements=("{S} lives in {v}.", "{S} has a home in {v}.", "{S} has lived in {v} for years.",
                        "The home of {s} is in {v}.", "{S} resides in {v}."),
            predicates=("lives in {v}", "has a home in {v}"),
            questions=("In which city does {s} live?", "Where does {s} live?"),
            paraphrases=("Where is the home of {s}?", "Which city does {s} call home?", "Where does {s} reside?"),
        ),
        Relation(
            "born", "person", "year",
            statements=("{S} was born in {v}.", "{S} was born in the year {v}.", "The birth year of {s} is {v}."),
            predicates=("was born in {v}",),
            questions=("In which year was {s} born?", "When was {s} born?"),
            paraphrases=("What is the birth year of {s}?", "In what year did {s} come into the world?"),
        ),
        Relation(
            "studied", "person", "city",
            statements=("{S} studied in {v}.", "{S} went to university in {v}.", "{S} was educated in {v}."),
            predicates=("studied in {v}",),
            questions=("In which city did {s} study?", "Where did {s} study?"),
            paraphrases=("Where did {s} go to university?", "Where was {s} educated?"),
        ),
    )
}
"""Facts about people (the second hop of two-hop questions, and their distractors)."""

BRIDGES = ("owner", "head")
"""Organisation -> person relations a two-hop question can go through."""
