"""Constrained decoding on the HF backend: one llguidance matcher per generating sequence.

`GrammarMask` is made by the waiting worker thread (`HFBackend.generate`, where compiling
costs nobody else's step) and owned by the sequence's `TokenChooser`; the engine calls
`apply` on the sequence's own row of logits before the token is chosen and `advance` after,
so the constraint is per sequence: a batch decodes constrained and free sequences
together, each with its own grammar. Once the grammar is complete the mask allows only the
end-of-sequence token (so the turn ends as any turn does), and `exhausted` ends the sequence
when the model names no end token.

Why a mask per row and not llguidance's parallel batch fill: a mask costs tens of
microseconds on the embedded model against milliseconds for the decode step
(benchmarks/grammar_libraries.py), so the simple per-row call costs under 1 % of a step.

llguidance's tokenizer view (`LLTokenizer`) takes about a second to build from a fast HF
tokenizer, so one is kept per tokenizer object (weakly keyed) and vocabulary width.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .._per_object import PerObject
from ..constraints import Constraint
from ..errors import ConstraintError

_SHIFTS = torch.arange(32, dtype=torch.int32)
_views: PerObject[dict[tuple[int, int | None], Any]] = PerObject(lambda tokenizer: {})
_views_lock = threading.Lock()


def llg_tokenizer(tokenizer: Any, vocab: int, eos: int | None) -> Any:
    """llguidance's view of `tokenizer` for logits `vocab` wide, ending with `eos` (cached)."""
    import llguidance.hf  # lazy: only constrained generations need it

    views = _views.get(tokenizer)
    key = (vocab, eos)
    with _views_lock:
        view = views.get(key)
        if view is None:
            try:
                view = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos)
            except ValueError as error:  # a slow (Python) tokenizer
                raise ConstraintError(
                    f"constraint: llguidance needs the model's fast tokenizer ({error}); load it with use_fast=True"
                ) from None
            views[key] = view
    return view


class GrammarMask:
    """The allowed next tokens of one sequence under `constraint` (see the module docs)."""

    def __init__(self, constraint: Constraint, tokenizer: Any, vocab: int, eos: int | None) -> None:
        from llguidance import LLMatcher  # lazy: only a constrained generation loads the grammar engine

        self.vocab, self.eos = vocab, eos
        self.matcher = LLMatcher(llg_tokenizer(tokenizer, vocab, eos), constraint.grammar())
        if self.matcher.is_error():
            raise ConstraintError(f"constraint: the constrained decoder refused it: {self.matcher.get_error()}")
        self._bits = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)

    @property
    def exhausted(self) -> bool:
        """True once the grammar is complete and there is no end token to write: the sequence
        must end now. (With an end token the mask then allows only it, so the model writes
        it as it would at the end of any turn.)"""
        return self.eos is None and bool(self.matcher.is_stopped())

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """Set the scores of every disallowed token to -inf (in place; `scores` `[1, vocab]`)."""
        row = self._bits[0]  # llguidance writes the mask straight into this tensor's memory
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        if self.matcher.is_error():
            raise ConstraintError(f"constraint: no token can continue the output: {self.matcher.get_error()}")
        allowed = ((self._bits[0].unsqueeze(-1) >> _SHIFTS) & 1).reshape(-1)[: scores.shape[-1]].bool()
        return scores.masked_fill_(~allowed, float("-inf"))

    def advance(self, token: int) -> None:
        """Move the matcher past the chosen token (always an allowed one)."""
        if not self.matcher.consume_token(token):
            raise ConstraintError(f"constraint: token {token} broke the constraint: {self.matcher.get_error()}")
