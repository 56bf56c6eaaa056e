"""The inbox side of a handoff: `HFReceiver` queues deliveries and turns them into generate inputs.

Each transfer snapshots the receiver's rendered prompt (`prepare_request`), and `pop()`
returns generate inputs with the received rows *before* that prompt, prefilled afresh
(foreign KV is never spliced into a receiver cache). Bound agents (`rclc.Agent`) are
receivers too and build their continuations from the same joined rows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from ._arguments import is_exact_int, optional_int
from .errors import ContextLimitError, EmptyInboxError, RclcError
from .hf_senders import check_compatible, hf_generation_inputs, prompt_ids, render_messages
from .models import check_model, context_window
from .state import Delivery, SenderState, embedding_weight, request_ids


@dataclass(frozen=True)
class JoinedHandoffs:
    """Taken deliveries in queue order followed by a prompt: what a continuation starts from.

    `known_ids` are -1 where a handoff carried rows without IDs; the `inherited` received
    positions come first; `max_new_tokens` is the output reserved for generating from it.
    """

    rows: torch.Tensor
    known_ids: torch.Tensor
    inherited: int
    max_new_tokens: int


@dataclass(frozen=True)
class PreparedRequest:
    """A receiver's prompt snapshot for one request and the room left for the handoff."""

    input_ids: torch.Tensor
    max_new_tokens: int
    available_positions: int


class HFReceiver:
    """An inbox of handoffs for a local HF model; `pop()` returns inputs for `model.generate`."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        messages: Any = None,
        max_new_tokens: int | None = None,
        context_limit: int | None = None,
    ) -> None:
        check_model(model)
        optional_int("max_new_tokens", max_new_tokens, minimum=1)
        self.context_limit = context_window(model, context_limit)
        self.model = model
        self.tokenizer = tokenizer
        self.messages = messages
        self.max_new_tokens = max_new_tokens
        self._queue: deque[tuple[Delivery, PreparedRequest]] = deque()

    # -- planning (called by transfer before any selection) --------------------------

    def validate_sender(self, sender: SenderState) -> None:
        """Refuse a sender of another checkpoint, architecture or vocabulary (before any selection)."""
        check_compatible(self.model, self.tokenizer, sender)

    def _output_allowance(self) -> int:
        return self.max_new_tokens if self.max_new_tokens is not None else 1

    def _request_prompt(self, request: Any) -> torch.Tensor:
        weight = embedding_weight(self.model)
        if isinstance(request, torch.Tensor):
            if self.messages:
                raise RclcError(
                    "request: a token-ID request cannot be framed into this receiver's chat history; "
                    "send text, or bind the receiver without messages"
                )
            return request_ids(request, self.tokenizer, weight)
        if not isinstance(request, str) or not request.strip():
            raise RclcError("request: expected non-empty text or int64 IDs [1, n]")
        if self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None):
            history = list(self.messages or [])
            ids = render_messages(self.tokenizer, [*history, {"role": "user", "content": request}], generation_prompt=True)
            return request_ids(ids, self.tokenizer, weight)
        if self.messages:
            raise RclcError("messages: the receiver has chat history but its tokenizer has no chat template")
        return request_ids(request, self.tokenizer, weight)

    def prepare_request(self, request: Any) -> PreparedRequest:
        """Snapshot this receiver's prompt for `request` and the room it leaves for the handoff."""
        ids = self._request_prompt(request)
        output = self._output_allowance()
        return PreparedRequest(ids, output, self.context_limit - ids.shape[1] - output)

    # -- the inbox ---------------------------------------------------------------------

    def _enqueue(self, delivery: Delivery, prepared: PreparedRequest) -> None:
        self._queue.append((delivery, prepared))

    def __call__(self, delivery: Delivery) -> None:
        """Receive a delivery outside `transfer` (the prompt is prepared now)."""
        if not isinstance(delivery, Delivery):
            raise RclcError(f"delivery: expected rclc.Delivery, got {type(delivery).__name__}")
        self._enqueue(delivery, self.prepare_request(delivery.request))

    def __len__(self) -> int:
        """Queued deliveries."""
        return len(self._queue)

    def peek(self, index: int = 0) -> tuple[Delivery, PreparedRequest]:
        """The `index`-th queued delivery and its prepared prompt, without consuming it."""
        if not is_exact_int(index) or not 0 <= index < len(self._queue):
            raise RclcError(f"request_index: expected an int in [0, {len(self._queue)}), got {index!r}")
        return self._queue[index]

    def selection_html(self, request_index: int = 0) -> str:
        """The recorded selection of a queued delivery, without consuming it."""
        delivery, _ = self.peek(request_index)
        return delivery.selection_html()

    def _take(self, deliveries: int) -> list[tuple[Delivery, PreparedRequest]]:
        if not is_exact_int(deliveries) or deliveries < 1:
            raise RclcError(f"deliveries: expected an int >= 1, got {deliveries!r}")
        if not self._queue:
            raise EmptyInboxError("pop from an empty receiver: await transfer(...) first")
        if deliveries > len(self._queue):
            raise EmptyInboxError(f"deliveries: {deliveries} requested but only {len(self._queue)} are queued")
        return [self._queue[i] for i in range(deliveries)]

    def _join(
        self, taken: list[tuple[Delivery, PreparedRequest]], prompt: Any, max_new_tokens: int | None
    ) -> JoinedHandoffs:
        """Rows of the taken deliveries in queue order, then the prompt of the last one (or `prompt`)."""
        prepared = taken[-1][1]
        output = optional_int("max_new_tokens", max_new_tokens, minimum=1) or prepared.max_new_tokens
        ids = prepared.input_ids if prompt is None else prompt_ids(self.model, self.tokenizer, prompt)
        received = sum(delivery.positions for delivery, _ in taken)
        needed = received + ids.shape[1] + output
        if needed > self.context_limit:
            raise ContextLimitError(
                f"context space: {received} received + {ids.shape[1]} prompt + {output} output positions = "
                f"{needed} exceed the context limit of {self.context_limit}; use a smaller budget or fewer output tokens"
            )
        weight = embedding_weight(self.model)
        with torch.no_grad():
            parts = [delivery.rows(weight) for delivery, _ in taken]
            rows = torch.cat([*parts, weight[ids[0].to(weight.device)]], dim=0)
        known = torch.cat([*(_delivery_ids(delivery, weight).to(rows.device) for delivery, _ in taken),
                           ids[0].to(rows.device)])
        return JoinedHandoffs(rows, known, received, output)

    def pop(self, *, prompt: Any = None, max_new_tokens: int | None = None, deliveries: int = 1) -> dict[str, Any]:
        """Generate inputs for the oldest delivery: received rows, then the receiver's prompt.

        `deliveries=k` joins the k oldest deliveries (e.g. handoffs of several transfers into
        one fan-in) in queue order before the prompt of the last. Deliveries leave the queue
        only when preparation succeeds.
        """
        taken = self._take(deliveries)
        joined = self._join(taken, prompt, max_new_tokens)
        for _ in taken:
            self._queue.popleft()
        return hf_generation_inputs(joined.rows, joined.max_new_tokens)

    def _queue_report(self, *, selection: bool) -> list[dict[str, Any]]:
        """Per queued delivery: positions per sender, bytes, prompt, reserved output and room left."""
        report = []
        for delivery, prepared in self._queue:
            retained = [message.positions for message in delivery.messages]
            entry: dict[str, Any] = {
                "senders": len(delivery.messages),
                "retained_positions": retained,
                "payload_bytes": delivery.nbytes,
                "prompt_positions": int(prepared.input_ids.shape[1]),
                "reserved_output_positions": prepared.max_new_tokens,
                "remaining_positions": prepared.available_positions - sum(retained),
            }
            if selection:
                entry["selection"] = [
                    None if m.selection is None else m.selection.inspect() for m in delivery.messages
                ]
            report.append(entry)
        return report


def _delivery_ids(delivery: Delivery, weight: torch.Tensor) -> torch.Tensor:
    """Token IDs of received positions where the message names them, else -1 (Message.receiver_ids)."""
    return torch.cat([message.receiver_ids(weight) for message in delivery.messages])
