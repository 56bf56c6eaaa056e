"""Scoring an answer against a case's accepted answers.

The default, `containment`, is deliberately simple and the same for every arm: both texts are
normalised (Unicode NFKC, case folded, every punctuation or symbol character replaced by a
space, whitespace collapsed) and the output is correct when one accepted answer appears in it
as a whole run of words. Word boundaries matter: "19" is not found in "1984", nor "Lima" in
"Limassol". Containment forgives a model that answers in a sentence ("It is owned by Alice
Moreno."), which small models do; it also accepts an output that lists several candidates,
which is why the report shows answers and their lengths next to accuracy.

A custom scorer is `package.module:callable`, called as `scorer(output, answers)` and
returning a bool. Naming code to import is refused unless `trust_code=True` (the same rule, and
the same importer, as selectors named in YAML: executors/trusted_code.py).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Callable, Sequence

from ..executors.trusted_code import import_callable
from ..spec.models import is_callable_ref
from ..errors import UsageError

DEFAULT_SCORER = "containment"
_SPACES = re.compile(r"\s+")


def normalise(text: str) -> str:
    """NFKC, case folded, punctuation and symbols turned into spaces, whitespace collapsed."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(" " if unicodedata.category(char)[0] in "PS" else char for char in folded)
    return _SPACES.sub(" ", kept).strip()


def containment(output: str, answers: Sequence[str]) -> bool:
    """True when a normalised accepted answer is a whole-word run of the normalised output."""
    haystack = f" {normalise(output)} "
    for answer in answers:
        needle = normalise(answer)
        if needle and f" {needle} " in haystack:
            return True
    return False


@dataclass(frozen=True)
class Scorer:
    """A named scoring function; `name` is recorded with every result row."""

    name: str
    function: Callable[[str, Sequence[str]], bool]

    def __call__(self, output: str, answers: Sequence[str]) -> bool:
        verdict = self.function(output, tuple(answers))
        if not isinstance(verdict, bool):
            raise TypeError(f"scorer {self.name}: expected a bool from scorer(output, answers), got {type(verdict).__name__}")
        return verdict


def load_scorer(reference: str | None = None, *, trust_code: bool = False) -> Scorer:
    """`None` or "containment" for the default; "package.module:callable" with trust_code."""
    if reference is None or reference == DEFAULT_SCORER:
        return Scorer(DEFAULT_SCORER, containment)
    if not is_callable_ref(reference):
        raise UsageError(f"scorer: {reference!r} is neither {DEFAULT_SCORER!r} nor package.module:callable")
    return Scorer(reference, import_callable(reference, trust_code=trust_code, field_name="scorer"))
