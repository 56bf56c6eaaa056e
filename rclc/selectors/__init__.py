"""Selectors: which sender positions a handoff keeps for one request.

Built-ins (`cacheback`, the default; `qsnap`; `chunkkv`) score positions with the model's
own attention over a private view of the sender cache and keep whole spans; they always
keep the first position and the latent tail. `recent` and `random_selector` are
baselines for experiments. Any callable with the `Selector` signature works too; its
output is checked by `validate_positions`. The names of the built-ins live in
`rclc.policy` (torch-free), for code that only needs to know them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Union

import torch

from ..state import SenderState
from ._spans import fixed_span_keep, fixed_spans, keep_spans
from ._validate import check_ids_reproduce_rows, gather_rows, validate_positions
from .baselines import random_selector, recent
from .cacheback import cacheback, cacheback_scores
from .chunkkv import chunkkv, chunkkv_scores
from .qsnap import qsnap, qsnap_scores

Selector = Callable[[SenderState, torch.Tensor, int], Union[Sequence[int], torch.Tensor]]

BUILTIN: dict[str, Selector] = {"cacheback": cacheback, "qsnap": qsnap, "chunkkv": chunkkv}
"""The attention selectors by name, in `rclc.policy.ATTENTION_SELECTORS` order."""
_BUILTIN_FUNCTIONS = frozenset(BUILTIN.values())


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
