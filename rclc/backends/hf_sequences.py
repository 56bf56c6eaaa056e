"""One generation in the batching engine: what its waiter and the engine's loop share.

A `Sequence` is built by the waiting worker thread (`HFBackend.generate`) and submitted;
from then on only the engine's threads (prefill, then decode) touch it, and the two sides
talk through a queue: a ("token", id) per token, in order, then one ("end", Outcome).
`TracedSequence` is what the engine's tracing diagnostic records of a finished sequence.
"""

from __future__ import annotations

import contextvars
import hashlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .token_choice import TokenChooser


@dataclass
class Outcome:
    """How a sequence ended: its tokens, its cache layers (prompt + every token: the engine
    forwards the last one in one more decode step, `Sequence.closing`; prompt + tokens but the
    last, as `generate` leaves them, where that step could not run: the continuation then
    forwards it), and why it ended."""

    tokens: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    stopped: bool = False
    cancelled: bool = False
    error: BaseException | None = None


class Sequence:
    """One generation: its prompt (`input_ids [1, n]` or `inputs_embeds [1, n, hidden]`, with
    `past`, the KV of its first positions, when a retained state's cache is reused), limits
    and events. Built by the waiter; the engine thread owns its decoding state."""

    def __init__(
        self,
        *,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        max_new_tokens: int,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        end_tokens: frozenset[int],
        chooser: TokenChooser,
        stop: threading.Event | None,
        cancel: threading.Event | None,
    ) -> None:
        self.input_ids, self.inputs_embeds = input_ids, inputs_embeds
        self.max_new_tokens, self.end_tokens, self.chooser = max_new_tokens, end_tokens, chooser
        self.past = past  # KV of the prompt's first positions (`Agent.generate(from_state=True)`): not forwarded again
        self.stop, self.cancel = stop, cancel
        self.context = contextvars.copy_context()  # the submitter's: its prefill runs in it
        self.traced: tuple[str, list[float]] | None = None  # (prompt digest, margins) while tracing
        self.tokens: list[int] = []
        self.stopped = False  # the stop event was seen set after a token (`generate`'s criterion fired)
        # ended (end token, length or constraint), and in the batch for one more step that only
        # forwards its last token, so its cache covers every token: the state built after
        # generation needs that position, and a row in a decode step costs a fraction of the
        # forward of one row alone
        self.closing = False
        self.abandoned = threading.Event()  # the waiter stopped listening (its on_token raised)
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

    # -- engine side ---------------------------------------------------------------------

    def gone(self) -> bool:
        """The caller was cancelled or stopped listening: decode nothing more for it."""
        return self.abandoned.is_set() or (self.cancel is not None and self.cancel.is_set())

    def add(self, token: int) -> bool:
        """Record and report a token; True when it ends the sequence (checked as `generate`'s
        stopping criteria are: after every token, the first included; and once a constraint
        allows nothing more).

        The stop event is read before the token is reported, never after: a waiter whose
        `on_token` sets it (a run stopped from its own token events) then always receives the
        next token and can refuse it. Read after, the waiter could set it in between and the
        sequence would end on the very token that asked for the stop, recorded as a normal
        stop (issue 24: a run stopped at its second token kept its generation under load)."""
        by_event = self.stop is not None and self.stop.is_set()
        self.tokens.append(token)
        self._events.put(("token", token))
        self.stopped = self.stopped or by_event
        return (token in self.end_tokens or len(self.tokens) >= self.max_new_tokens or by_event or self.gone()
                or self.chooser.finished)

    def outcome(self, layers: list[tuple[torch.Tensor, torch.Tensor]] | None, error: BaseException | None = None) -> Outcome:
        """How the sequence ended, for `deliver` (the engine never touches it afterwards)."""
        cancelled = error is None and self.gone()
        return Outcome(list(self.tokens), layers, self.stopped and error is None, cancelled, error)

    def deliver(self, outcome: Outcome) -> None:
        self._events.put(("end", outcome))

    def finish(self, layers: list[tuple[torch.Tensor, torch.Tensor]] | None, error: BaseException | None = None) -> None:
        """End the sequence now (outside the loop's normal delivery)."""
        self.deliver(self.outcome(layers, error))

    # -- waiter side ---------------------------------------------------------------------

    def wait(self, on_token: Any, settle: Callable[[], None]) -> Outcome:
        """Block until the sequence ends, calling `on_token(token)` for each token in order.

        If `on_token` raises, the sequence is abandoned; the error is raised once the engine
        has dropped it (at its next step) and `settle` returned (the engine's: it waits for
        the engine's threads when nothing else is left to decode), so nothing keeps computing for
        a caller that gave up. A cancelled sequence settles the same way.
        """
        while True:
            kind, value = self._events.get()
            if kind == "end":
                if value.cancelled:
                    settle()
                return value
            if on_token is not None:
                try:
                    on_token(value)
                except BaseException:
                    self.abandoned.set()
                    while self._events.get()[0] != "end":
                        pass
                    settle()
                    raise


@dataclass(frozen=True)
class TracedSequence:
    """One decoded sequence as `BatchingEngine.tracing` records it: which prompt (sha256 of
    its rows or IDs), its tokens, and at each token the margin between the two largest
    logits. A greedy token whose margin is within float32 rounding of 0 may differ between
    a batched and an unbatched decode; the margin says when that is the explanation."""

    prompt: str
    tokens: tuple[int, ...]
    margins: tuple[float, ...]


def digest(tensor: torch.Tensor) -> str:
    """sha256 of a prompt tensor's values (which prompt a traced sequence decoded)."""
    return hashlib.sha256(tensor.detach().to("cpu").contiguous().numpy().tobytes()).hexdigest()


def margins(logits: torch.Tensor) -> list[float]:
    """Per row of `[..., vocab]` logits: the largest minus the second largest."""
    top = logits.topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).reshape(-1).tolist()
