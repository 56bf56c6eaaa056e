"""Hugging Face helpers: build a SenderState from what an HF loop already has, and receive handoffs.

`sender_from_hf` accepts the forms an agent loop naturally holds (chat messages, rendered
text, exact IDs, a generate output, a complete or prefix cache) and never mutates the
caller's cache. `HFReceiver` is an inbox: each transfer snapshots the receiver's rendered
prompt, and `pop()` returns generate inputs with the received rows *before* that prompt,
prefilled afresh (foreign KV is never spliced into a receiver cache).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from ._cache import cache_layers, cache_length, extend, generation_cache, prefill
from ._checks import is_exact_int, optional_int
from .models import check_model, context_limit_of
from .state import Delivery, SenderState, checkpoint_vocabulary, embedding_weight, request_ids

_MATCHED_CONFIG = (
    "model_type",
    "hidden_size",
    "vocab_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


def _is_messages(prompt: Any) -> bool:
    return isinstance(prompt, (list, tuple)) and not isinstance(prompt, str)


def render_messages(tokenizer: Any, messages: Any, *, generation_prompt: bool) -> torch.Tensor:
    """Chat messages -> `[1, n]` IDs through the tokenizer's own template (thinking disabled)."""
    if tokenizer is None:
        raise ValueError("messages: rendering chat messages needs a tokenizer; pass token IDs [1, n] instead")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("messages: the tokenizer has no chat template; pass rendered text or token IDs instead")
    if not messages:
        raise ValueError("messages: the chat history is empty; pass at least one message")
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=generation_prompt, enable_thinking=False
    )
    return tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]


def prompt_ids(model: Any, tokenizer: Any, prompt: Any) -> torch.Tensor:
    """Messages (no generation prompt), rendered text (no special tokens) or `[1, n]` IDs -> IDs."""
    weight = embedding_weight(model)
    if _is_messages(prompt):
        ids = render_messages(tokenizer, prompt, generation_prompt=False)
        return request_ids(ids, tokenizer, weight)
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt: text needs a tokenizer; this agent has none, so pass token IDs [1, n]")
        if not prompt:
            raise ValueError("prompt: empty text; pass the rendered prompt")
        return request_ids(tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"], tokenizer, weight)
    if isinstance(prompt, torch.Tensor):
        try:
            return request_ids(prompt, tokenizer, weight)
        except ValueError as error:
            raise ValueError(str(error).replace("request:", "prompt:", 1)) from None
    raise ValueError(f"prompt: expected chat messages, rendered text or int64 IDs [1, n], got {type(prompt).__name__}")


def _check_generation(generation: Any) -> tuple[torch.Tensor, Any]:
    name = type(generation).__name__
    sequences = getattr(generation, "sequences", None)
    if sequences is None or not isinstance(sequences, torch.Tensor):
        raise ValueError(
            "generation: expected the output of model.generate(..., return_dict_in_generate=True), "
            f"got {name}"
        )
    if "Beam" in name or getattr(generation, "beam_indices", None) is not None:
        raise ValueError("generation: beam-search outputs are not supported; use greedy decoding or sampling")
    if "EncoderDecoder" in name:
        raise ValueError("generation: encoder-decoder outputs are not supported; use a decoder-only model")
    if sequences.dim() != 2 or sequences.shape[0] != 1:
        raise ValueError(f"generation: expected one unpadded sequence, got sequences shaped {tuple(sequences.shape)}")
    return sequences, generation_cache(generation)


def complete_state(model: Any, tokenizer: Any, ids: torch.Tensor, cache: Any) -> SenderState:
    """Rows for `ids`, and a cache of exactly those rows built from `cache`'s prefix (never mutated)."""
    total = ids.shape[1]
    limit = context_limit_of(model)
    if total > limit:
        raise ValueError(f"prompt: {total} positions exceed the model's context limit of {limit}")
    weight = embedding_weight(model)
    with torch.no_grad():
        rows = weight[ids[0].to(weight.device)]
    cached = cache_length(cache)
    if cached > total:
        raise ValueError(
            f"past_key_values: the cache holds {cached} positions but the prompt has only {total}; "
            "pass the exact IDs the cache was built from"
        )
    if cache is None or cached == 0:
        cache = prefill(model, rows)
    elif cached < total:
        layers = cache_layers(cache)
        if len(layers) != model.config.num_hidden_layers or layers[0][0].shape[0] != 1:
            raise ValueError("past_key_values: expected an unpadded batch-1 cache with one entry per layer")
        cache = extend(model, cache, rows[cached:])
    state = SenderState(
        model=model, past_key_values=cache, input_embeds=rows, tokenizer=tokenizer, token_ids=ids[0].clone()
    )
    state.validate()
    return state


def sender_from_hf(
    model: Any,
    tokenizer: Any = None,
    prompt: Any = None,
    *,
    past_key_values: Any = None,
    generation: Any = None,
) -> SenderState:
    """A validated SenderState from messages, rendered text, exact IDs or a generate output.

    A complete cache is reused as is, a prefix cache is extended on a private copy, no
    cache means one prefill. The caller's cache object is never modified.
    """
    check_model(model)
    if generation is not None:
        if prompt is not None or past_key_values is not None:
            raise ValueError("generation: pass it alone; it already holds the prompt IDs and the cache")
        sequences, cache = _check_generation(generation)
        if cache is not None and cache_length(cache) > sequences.shape[1]:
            raise ValueError(
                "generation: its sequences do not include the whole prompt (an inputs_embeds generation?); "
                "build a SenderState from the rows instead, or use agent.update(inputs=..., generation=...)"
            )
        ids = request_ids(sequences, tokenizer, embedding_weight(model))
        return complete_state(model, tokenizer, ids, cache)
    if prompt is None:
        raise ValueError("prompt: pass chat messages, rendered text, token IDs [1, n] or generation=")
    ids = prompt_ids(model, tokenizer, prompt)
    return complete_state(model, tokenizer, ids, past_key_values)


def check_compatible(receiver_model: Any, receiver_tokenizer: Any, sender: SenderState) -> None:
    """Refuse a sender whose checkpoint, architecture or vocabulary differs from the receiver's."""
    check_model(receiver_model)
    mine, theirs = receiver_model.config, sender.model.config
    for name in _MATCHED_CONFIG:
        if getattr(mine, name, None) != getattr(theirs, name, None):
            raise ValueError(
                f"receiver: its model's {name}={getattr(mine, name, None)!r} differs from the sender's "
                f"{getattr(theirs, name, None)!r}; sender and receiver must share one checkpoint"
            )
    for name in ("_name_or_path", "_commit_hash"):
        a, b = getattr(mine, name, None), getattr(theirs, name, None)
        if a and b and a != b:
            raise ValueError(
                f"receiver: checkpoint {name} {a!r} differs from the sender's {b!r}; use the same checkpoint"
            )
    other = sender.tokenizer
    if receiver_tokenizer is not None and other is not None and receiver_tokenizer is not other:
        rows = int(embedding_weight(receiver_model).shape[0])
        if checkpoint_vocabulary(receiver_tokenizer, rows) != checkpoint_vocabulary(other, rows):
            raise ValueError("receiver: its tokenizer vocabulary differs from the sender's; use the same tokenizer")


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
        optional_int("context_limit", context_limit, minimum=1)
        limit = context_limit_of(model)
        if context_limit is not None and context_limit > limit:
            raise ValueError(f"context_limit: {context_limit} exceeds the model's limit of {limit}")
        self.model = model
        self.tokenizer = tokenizer
        self.messages = messages
        self.max_new_tokens = max_new_tokens
        self.context_limit = context_limit if context_limit is not None else limit
        self._queue: deque[tuple[Delivery, PreparedRequest]] = deque()

    # -- planning (called by transfer before any selection) --------------------------

    def validate_sender(self, sender: SenderState) -> None:
        check_compatible(self.model, self.tokenizer, sender)

    def _output_allowance(self) -> int:
        return self.max_new_tokens if self.max_new_tokens is not None else 1

    def _request_prompt(self, request: Any) -> torch.Tensor:
        weight = embedding_weight(self.model)
        if isinstance(request, torch.Tensor):
            if self.messages:
                raise ValueError(
                    "request: a token-ID request cannot be framed into this receiver's chat history; "
                    "send text, or bind the receiver without messages"
                )
            return request_ids(request, self.tokenizer, weight)
        if not isinstance(request, str) or not request.strip():
            raise ValueError("request: expected non-empty text or int64 IDs [1, n]")
        if self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None):
            history = list(self.messages or [])
            ids = render_messages(self.tokenizer, [*history, {"role": "user", "content": request}], generation_prompt=True)
            return request_ids(ids, self.tokenizer, weight)
        if self.messages:
            raise ValueError("messages: the receiver has chat history but its tokenizer has no chat template")
        return request_ids(request, self.tokenizer, weight)

    def prepare_request(self, request: Any) -> PreparedRequest:
        ids = self._request_prompt(request)
        output = self._output_allowance()
        return PreparedRequest(ids, output, self.context_limit - ids.shape[1] - output)

    # -- the inbox ---------------------------------------------------------------------

    def _enqueue(self, delivery: Delivery, prepared: PreparedRequest) -> None:
        self._queue.append((delivery, prepared))

    def __call__(self, delivery: Delivery) -> None:
        """Receive a delivery outside `transfer` (the prompt is prepared now)."""
        if not isinstance(delivery, Delivery):
            raise ValueError(f"delivery: expected rclc.Delivery, got {type(delivery).__name__}")
        self._enqueue(delivery, self.prepare_request(delivery.request))

    def __len__(self) -> int:
        return len(self._queue)

    def peek(self, index: int = 0) -> tuple[Delivery, PreparedRequest]:
        if not is_exact_int(index) or not 0 <= index < len(self._queue):
            raise ValueError(f"request_index: expected an int in [0, {len(self._queue)}), got {index!r}")
        return self._queue[index]

    def selection_html(self, request_index: int = 0) -> str:
        """The recorded selection of a queued delivery, without consuming it."""
        delivery, _ = self.peek(request_index)
        return delivery.selection_html()

    def _take(self, deliveries: int) -> list[tuple[Delivery, PreparedRequest]]:
        if not is_exact_int(deliveries) or deliveries < 1:
            raise ValueError(f"deliveries: expected an int >= 1, got {deliveries!r}")
        if not self._queue:
            raise IndexError("pop from an empty receiver: await transfer(...) first")
        if deliveries > len(self._queue):
            raise IndexError(f"deliveries: {deliveries} requested but only {len(self._queue)} are queued")
        return [self._queue[i] for i in range(deliveries)]

    def _build_inputs(
        self, taken: list[tuple[Delivery, PreparedRequest]], prompt: Any, max_new_tokens: int | None
    ) -> tuple[dict[str, Any], torch.Tensor]:
        """Rows of the taken deliveries in queue order, then the prompt of the last one (or `prompt`)."""
        prepared = taken[-1][1]
        output = optional_int("max_new_tokens", max_new_tokens, minimum=1) or prepared.max_new_tokens
        ids = prepared.input_ids if prompt is None else prompt_ids(self.model, self.tokenizer, prompt)
        received = sum(delivery.positions for delivery, _ in taken)
        needed = received + ids.shape[1] + output
        if needed > self.context_limit:
            raise ValueError(
                f"context space: {received} received + {ids.shape[1]} prompt + {output} output positions = "
                f"{needed} exceed the context limit of {self.context_limit}; use a smaller budget or fewer output tokens"
            )
        weight = embedding_weight(self.model)
        with torch.no_grad():
            parts = [delivery.rows(weight) for delivery, _ in taken]
            rows = torch.cat([*parts, weight[ids[0].to(weight.device)]], dim=0)
        inputs = {
            "inputs_embeds": rows.unsqueeze(0),
            "attention_mask": torch.ones(1, rows.shape[0], dtype=torch.long, device=rows.device),
            "max_new_tokens": output,
        }
        return inputs, ids

    def pop(self, *, prompt: Any = None, max_new_tokens: int | None = None, deliveries: int = 1) -> dict[str, Any]:
        """Generate inputs for the oldest delivery: received rows, then the receiver's prompt.

        `deliveries=k` joins the k oldest deliveries (e.g. handoffs of several transfers into
        one fan-in) in queue order before the prompt of the last. Deliveries leave the queue
        only when preparation succeeds.
        """
        taken = self._take(deliveries)
        inputs, _ = self._build_inputs(taken, prompt, max_new_tokens)
        for _ in taken:
            self._queue.popleft()
        return inputs
