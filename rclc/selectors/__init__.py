"""Selectors: which sender positions a handoff keeps for one request.

Built-ins (`cacheback`, the default; `qsnap`; `chunkkv`) score positions with the model's
own attention over a private view of the sender cache and keep whole spans; they always
keep the first position and the latent tail. `recent` and `random_selector` are
baselines for experiments. Any callable with the `Selector` signature works too; its
output is checked by `validate_positions`. The names of the built-ins, their options and
kinds live in one torch-free table, `rclc.policy.SELECTORS`; `BUILTIN` and `builtin` here
are derived from it (adding a selector: its module, its import below, its row there).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, Union

import torch

from ..errors import RclcError
from ..policy import SELECTORS
from ..state import SenderState
from ._spans import fixed_span_keep, fixed_spans, keep_spans
from ._validate import check_ids_reproduce_rows, gather_rows, validate_positions
from .baselines import random_selector, recent
from .cacheback import cacheback, cacheback_scores
from .chunkkv import chunkkv, chunkkv_scores
from .qsnap import qsnap, qsnap_scores

Selector = Callable[[SenderState, torch.Tensor, int], Union[Sequence[int], torch.Tensor]]


def _function(name: str) -> Any:
    """The function of this module that `rclc.policy.SELECTORS[name]` names."""
    return getattr(sys.modules[__name__], SELECTORS[name].function)


BUILTIN: dict[str, Selector] = {name: _function(name) for name, entry in SELECTORS.items() if entry.attention}
"""The attention selectors by name, in `rclc.policy.ATTENTION_SELECTORS` order."""
_BUILTIN_FUNCTIONS = frozenset(BUILTIN.values())


def builtin(name: str, options: dict[str, Any] | None = None, *, seed: int = 0) -> Selector:
    """The built-in selector `name` (a key of `rclc.policy.SELECTORS`) with `options` bound.

    A seeded one (`random`) is made from `options["seed"]`, else from `seed`. Attention
    selectors are looked up in `BUILTIN` when called, so one replaced there is the one used.
    """
    entry = SELECTORS.get(name)
    if entry is None:
        raise RclcError(f"selector {name!r} is not a built-in one; use one of {', '.join(SELECTORS)}")
    options = dict(options or {})
    if entry.seeded:
        return _function(name)(int(options.get("seed", seed)))
    base = BUILTIN[name] if entry.attention else _function(name)
    return functools.partial(base, **options) if options else base


def is_builtin(selector: Any) -> bool:
    """True for a built-in selector or a `functools.partial` (at any depth) of one.

    Built-ins reserve protected positions in budget fitting; everything else is custom.
    """
    while isinstance(selector, functools.partial):
        selector = selector.func
    try:
        return selector in _BUILTIN_FUNCTIONS
    except TypeError:  # unhashable callable
        return False


__all__ = [
    "BUILTIN",
    "Selector",
    "builtin",
    "cacheback",
    "cacheback_scores",
    "check_ids_reproduce_rows",
    "chunkkv",
    "chunkkv_scores",
    "fixed_span_keep",
    "fixed_spans",
    "gather_rows",
    "is_builtin",
    "keep_spans",
    "qsnap",
    "qsnap_scores",
    "random_selector",
    "recent",
    "validate_positions",
]
