"""The selection steps `rclc.transfer` runs: its one way into the selectors' internals.

Internal (not in `rclc.selectors.__all__`, no stability promise): the transfer pipeline
imports this module and no private `rclc.selectors._*` module, so what selection needs of
receiver awareness, pooled allocation, batched request captures and the checks on what a
selector returned is listed here once.

- `check_receiver_aware`, `check_span_starts_option`: the transfer's `exclude=`,
  `allocation=` and `span_starts=` checked before any model work;
- `request_masks`: each sender's exclusion mask for one request;
- `bridge_flags`, `bridge`, `pool_profiles`: one bridge for a transfer's senders (`bridge=N`)
  and the pooled counts of its mixed profiles;
- `pool`: a fan-in's budget moved to the best spans across its senders;
- `prefetch_folds`: a fan-in's request captures in one batched forward;
- `select`: one sender's selection (selector or pooled profile), validated, its rows gathered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..state import SenderState
from ..user_code import user_code_turn
from . import is_builtin
from ._common import SpanProfile
from ._pooling import bridge_of
from ._prefetch import prefetch_folds
from ._receiver_aware import (
    accepts_exclude,
    Bridge,
    bridge,
    bridge_flags,
    pool_profiles,
    accepts_keyword,
    check_receiver_aware,
    check_span_starts_option,
    pool,
    request_masks,
    selector_name,
)
from ._support import SupportFold, offering
from ._validate import validate_positions

__all__ = [
    "SpanProfile",
    "Bridge",
    "bridge",
    "bridge_flags",
    "bridge_of",
    "pool_profiles",
    "SupportFold",
    "accepts_exclude",
    "check_receiver_aware",
    "check_span_starts_option",
    "pool",
    "prefetch_folds",
    "request_masks",
    "select",
    "selector_name",
]


def select(
    state: SenderState,
    ids: torch.Tensor,
    count: int,
    selector: Any,
    *,
    exclude: list[str | None] | None = None,
    profile: SpanProfile | None = None,
    span_starts: Sequence[int] | None = None,
    fold: SupportFold | None = None,
    pooled: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """(kept rows, their token IDs, their sender positions) of one sender for one request, in
    ascending source order. Runs in a worker thread without the preparation lock (the state is
    read only), so concurrent transfers' built-in selections run at once; a user's selector
    takes the user-code turn (`rclc.user_code`). `profile` (pooled allocation) keeps from
    precomputed scores instead of calling the selector; `span_starts` goes to selectors that
    take it; `fold` is this sender's request capture, made with the other senders' of its
    fan-in (`prefetch_folds`); `pooled`: whether `profile`'s count came from pooling."""
    if profile is not None:
        # pooling applied relevance across senders; a bridged per-sender profile applies its own
        positions: Any = profile.keep(count, relevant_only=not pooled)
    else:
        extra: dict[str, Any] = {}
        if exclude is not None:
            extra["exclude"] = exclude
        if span_starts is not None and accepts_keyword(selector, "span_starts"):
            extra["span_starts"] = span_starts
        turn = user_code_turn(selector, builtin=is_builtin(selector))
        with offering([] if fold is None else [(state, ids, fold)]), turn:
            positions = selector(state, ids, count, **extra)
    index = validate_positions(positions, count, state.positions, selector_name(selector))
    index = index.to(state.input_embeds.device)
    rows = state.input_embeds.index_select(0, index)
    kept_ids = None if state.token_ids is None else state.token_ids.index_select(0, index.to(state.token_ids.device))
    return rows, kept_ids, index.tolist()
