"""A fan-in's request folds, captured together before its senders' selections run.

CacheBack and QSnap score a sender by forwarding the request over its cache (a capture).
A request is a few rows, so a capture costs about what a decode step does: the whole
model's weights are read for a handful of rows. A transfer with several senders used to
pay that once per sender; here the senders that will score are captured in one batched
forward (`_support.request_folds`) and each selection then takes its fold from
`_support.offering` instead of capturing again. Selections stay per sender and unchanged
in what they compute (see `_attention_capture.capture_each` on rounding).

Only senders whose selection will score are captured (a budget that keeps every position
needs no scores), and only input the selector itself accepts: a sender or request the
selector would refuse is left to the selector, which raises its usual error.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import CaptureError, RclcError
from ..state import SenderState
from ._common import check_context, check_request_ids, check_sender
from ._support import SupportFold, request_folds
from .cacheback import cacheback
from .qsnap import qsnap

_REQUEST_SCORING = (cacheback, qsnap)


def scores_request(selector: Any) -> bool:
    """Whether `selector` (through any `functools.partial`) scores with `request_fold`."""
    while isinstance(selector, functools.partial):
        selector = selector.func
    return any(selector is builtin for builtin in _REQUEST_SCORING)


def prefetch_folds(
    selector: Any, states: Sequence[SenderState], request_ids: Sequence[torch.Tensor], scoring: Sequence[bool]
) -> list[SupportFold | None]:
    """The folds of the senders marked in `scoring`, captured in one batched forward per
    model; None where nothing was captured (fewer than two senders to score, a selector
    that does not score the request, or input the selector will refuse itself)."""
    folds: list[SupportFold | None] = [None] * len(states)
    if not scores_request(selector):
        return folds
    chosen = [i for i, wanted in enumerate(scoring) if wanted and _acceptable(states[i], request_ids[i])]
    if len(chosen) < 2:
        return folds
    try:
        captured = request_folds([states[i] for i in chosen], [request_ids[i] for i in chosen])
    except (RclcError, CaptureError):
        return folds  # each selection captures alone and reports its own error
    for index, fold in zip(chosen, captured):
        folds[index] = fold
    return folds


def _acceptable(state: Any, ids: Any) -> bool:
    try:
        check_sender(state)
        check_request_ids(ids)
        check_context(state, ids, "prefetch")
    except RclcError:
        return False
    return True
