"""The one place the graph layer imports code a user named (`package.module:callable`).

Selectors, reasoning methods and experiment scorers may be given as references to code. An
import runs that module's code, so it happens only when the caller passed `trust_code`, and
every refusal says which field named what and how to opt in.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from ..errors import PlanError, UsageError


def import_callable(reference: str, *, trust_code: bool, field_name: str) -> Callable[..., Any]:
    """The callable `reference` ("package.module:attribute.path") names.

    PlanError (E_TRUST_CODE) without `trust_code`; ValueError naming `field_name` when the
    module does not import, the attribute is missing or the target is not callable.
    """
    if not trust_code:
        raise PlanError.one(
            "E_TRUST_CODE",
            f"{field_name} {reference!r} imports code, and trust_code is off",
            "pass --trust-code / trust_code=True if you trust this code",
        )
    module_name, _, attribute = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"{field_name}: cannot import module {module_name!r} ({error})") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"{field_name}: module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise UsageError(f"{field_name}: {reference!r} is not callable")
    return target
