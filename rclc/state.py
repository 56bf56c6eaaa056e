"""The objects a handoff is made of: the sender's state, one sender's message, one delivery.

`SenderState` describes an existing sender exactly (input rows, the cache they built,
aligned token IDs, the latent tail and the inherited prefix). `Message` is what one
sender transmits after selection, and `Delivery` is what every receiver of one request
gets: the request plus one message per sender, in sender order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ._arguments import is_exact_int
from ._cache import cache_length, prefill
from .errors import IncompatibleStateError, RclcError
from .literal import encode_literal
from .models import check_model
from .selection import Selection
from .selection_html import selection_page


def embedding_weight(model: Any) -> torch.Tensor:
    """The model's input embedding table `[vocab, hidden]` (token ID -> input row)."""
    return model.get_input_embeddings().weight


# vLLM (0.30) registers this placeholder token when an engine enables prompt embeddings,
# on a shallow copy that shares the tokenizer's backend with vLLM's tokenizer cache; a
# later engine of the same checkpoint in the process then hands out a tokenizer with it.
VLLM_PLACEHOLDER = "<prompt_embeds>"


def checkpoint_vocabulary(tokenizer: Any, rows: int) -> dict[str, int]:
    """The tokenizer's vocabulary as the checkpoint defines it, for identity and compatibility.

    That is `get_vocab()` without vLLM's prompt-embedding placeholder when it sits past the
    embedding table (`>= rows`, so no model input can be that token): otherwise an engine
    tokenizer and the checkpoint's own would look like different vocabularies.
    """
    vocabulary = tokenizer.get_vocab()
    if vocabulary.get(VLLM_PLACEHOLDER, -1) >= rows:
        del vocabulary[VLLM_PLACEHOLDER]
    return vocabulary


@dataclass(eq=False)
class SenderState:
    """An existing sender: `input_embeds` `[T, hidden]` are the exact input rows that built
    `past_key_values`; `token_ids` (optional, `[T]` int64) marks continuous rows with -1;
    the last `latent_steps` rows are a continuous latent tail; the first
    `inherited_positions` rows came from earlier agents (they count in relative budgets).
    """

    model: Any
    past_key_values: Any
    input_embeds: torch.Tensor
    tokenizer: Any = None
    token_ids: torch.Tensor | None = None
    latent_steps: int = 0
    inherited_positions: int = 0

    @property
    def positions(self) -> int:
        """T: rows in the state (equal to the cache length)."""
        return int(self.input_embeds.shape[0]) if isinstance(self.input_embeds, torch.Tensor) else 0

    def validate(self, *, check_cache: bool = True) -> None:
        """Raise RclcError (IncompatibleStateError for rows, IDs or cache that do not match the model)
        naming the first field that breaks the invariants."""
        check_model(self.model)
        weight = embedding_weight(self.model)
        rows = self.input_embeds
        if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[0] < 1:
            shape = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
            raise RclcError(f"input_embeds: expected a [positions >= 1, hidden] tensor, got {shape}")
        if rows.shape[1] != weight.shape[1]:
            raise IncompatibleStateError(
                f"input_embeds: width {rows.shape[1]} differs from the model's hidden size {weight.shape[1]}"
            )
        if rows.dtype != weight.dtype or rows.device != weight.device:
            raise IncompatibleStateError(
                f"input_embeds: rows are {rows.dtype} on {rows.device}, the model's embeddings are "
                f"{weight.dtype} on {weight.device}; move the rows with .to(weight)"
            )
        total = rows.shape[0]
        if not is_exact_int(self.latent_steps) or not 0 <= self.latent_steps < total:
            raise RclcError(
                f"latent_steps: expected an int in [0, {total}) (at least one non-latent row), got {self.latent_steps!r}"
            )
        limit = total - self.latent_steps
        if not is_exact_int(self.inherited_positions) or not 0 <= self.inherited_positions <= limit:
            raise RclcError(
                f"inherited_positions: expected an int in [0, {limit}] (the inherited prefix may not overlap "
                f"the latent tail), got {self.inherited_positions!r}"
            )
        if self.token_ids is not None:
            ids = self.token_ids
            if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype != torch.int64 or ids.shape[0] != total:
                raise RclcError(f"token_ids: expected an int64 vector of length {total} aligned with the rows")
            vocab = weight.shape[0]
            if bool(((ids < -1) | (ids >= vocab)).any()):
                raise IncompatibleStateError(f"token_ids: every ID must be -1 (continuous row) or in [0, {vocab})")
            if self.latent_steps and bool((ids[total - self.latent_steps :] != -1).any()):
                raise RclcError("token_ids: the latent tail must be marked -1")
        if check_cache:
            if self.past_key_values is None:
                raise RclcError("past_key_values: a sender needs the cache its rows built (got None)")
            length = cache_length(self.past_key_values)
            if length != total:
                raise IncompatibleStateError(
                    f"past_key_values: cache holds {length} positions but input_embeds has {total} rows; "
                    "pass the cache built from exactly these rows"
                )

    def request_ids(self, request: str | torch.Tensor) -> torch.Tensor:
        """Tokenize a request for this sender: `[1, R]` int64 on the embedding device."""
        return request_ids(request, self.tokenizer, embedding_weight(self.model))

    def known_ids(self) -> torch.Tensor:
        """`token_ids`, or -1 (a continuous row) for every position when the state carries none."""
        if self.token_ids is not None:
            return self.token_ids
        return torch.full((self.positions,), -1, dtype=torch.int64, device=self.input_embeds.device)


def rows_match_ids(rows: torch.Tensor, token_ids: torch.Tensor | None, weight: torch.Tensor) -> bool:
    """Whether every row marked with a token ID is exactly that token's embedding (bit for bit).

    A receiver of a `token_ids+continuous` payload, and a restored snapshot, rebuild such
    rows from their IDs; any other row would silently change what the receiver sees.
    """
    if token_ids is None:
        return True
    discrete = (token_ids >= 0).to(rows.device)
    if not bool(discrete.any()):
        return True
    with torch.no_grad():
        expected = weight[token_ids.to(weight.device)[discrete.to(weight.device)]]
    return torch.equal(rows[discrete], expected.to(device=rows.device, dtype=rows.dtype))


def build_state(
    model: Any,
    tokenizer: Any,
    rows: torch.Tensor,
    token_ids: torch.Tensor | None = None,
    *,
    latent_steps: int = 0,
    inherited_positions: int = 0,
    cache: Any = None,
    prefill_rows: bool = True,
) -> SenderState:
    """The one way the core assembles a state from parts: validated, with `cache` or a fresh prefill.

    Rows, IDs and counts are checked before any forward, so invalid input costs no model
    work. With `cache=None` the rows are then prefilled from position 0 (what a restored
    snapshot, a selected-rows state and a refresh need), or, with `prefill_rows=False`,
    the state is returned without a cache (to check a snapshot before restoring it);
    otherwise `cache` must hold exactly these rows.
    """
    state = SenderState(
        model=model,
        past_key_values=cache,
        input_embeds=rows,
        tokenizer=tokenizer,
        token_ids=token_ids,
        latent_steps=latent_steps,
        inherited_positions=inherited_positions,
    )
    state.validate(check_cache=False)
    if cache is None and not prefill_rows:
        return state
    if cache is None:
        state.past_key_values = prefill(model, rows)
    state.validate()
    return state


def appended_rows(state: SenderState, new_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(all rows, their IDs, the new rows) of `state` followed by the tokens `new_ids` `[1, n]`.

    The new rows are the tokens' embeddings; positions without IDs keep -1.
    """
    weight = embedding_weight(state.model)
    with torch.no_grad():
        new_rows = weight[new_ids[0].to(weight.device)]
    rows = torch.cat([state.input_embeds, new_rows], dim=0)
    ids = torch.cat([state.known_ids().to(weight.device), new_ids[0].to(weight.device)])
    return rows, ids, new_rows


def request_ids(request: Any, tokenizer: Any, weight: torch.Tensor) -> torch.Tensor:
    """Text (literal: no special tokens added or parsed) or `[1, R]` int64 IDs -> validated IDs
    on `weight`'s device."""
    if isinstance(request, str):
        if not request.strip():
            raise RclcError("request: a text request must not be empty or whitespace")
        if tokenizer is None:
            raise RclcError("request: a text request needs a tokenizer; pass token IDs [1, n] instead")
        # a request is user text: control-token text in it stays text (rclc.literal)
        ids = torch.tensor([encode_literal(tokenizer, request).ids], dtype=torch.int64)
    elif isinstance(request, torch.Tensor):
        if request.dtype != torch.int64 or request.dim() != 2 or request.shape[0] != 1 or request.shape[1] < 1:
            raise RclcError(
                f"request: token IDs must be a non-empty int64 tensor shaped [1, n], got "
                f"{request.dtype} {tuple(request.shape)}"
            )
        ids = request
    else:
        raise RclcError(f"request: expected text or an int64 [1, n] tensor, got {type(request).__name__}")
    vocab = weight.shape[0]
    if bool(((ids < 0) | (ids >= vocab)).any()):
        raise RclcError(f"request: token IDs must lie in [0, {vocab})")
    return ids.to(weight.device)


@dataclass(frozen=True, eq=False)
class Message:
    """One sender's selected payload.

    With `token_ids` None, `continuous_rows` are every selected row in order. With IDs
    (representation `token_ids+continuous`), IDs cover every position and only the rows
    of the -1 positions are carried, in order.

    `source_ids` (only without `token_ids`: representation `embeddings`) name the token of
    each carried row (-1 for a continuous one). The rows still travel whole; the IDs let the
    receiver's state hold its inherited rows as text, so when it sends on, its sentences,
    exclusions and bridges cover what it inherited too (a chain hop otherwise sees inherited
    rows as runs of unnamed rows, cut by budget alone). A receiver adopts them only where
    the rows are exactly its own embeddings of those tokens (`Message.receiver_ids`).
    """

    continuous_rows: torch.Tensor
    token_ids: torch.Tensor | None = None
    selection: Selection | None = field(default=None, compare=False)
    source_ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rows = self.continuous_rows
        if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or not rows.is_floating_point() or rows.shape[1] < 1:
            raise RclcError("continuous_rows: expected a floating [n, hidden > 0] tensor")
        ids = self.token_ids
        if ids is None:
            if rows.shape[0] < 1:
                raise RclcError("continuous_rows: a message without token IDs needs at least one row")
            self._check_source_ids(rows.shape[0])
            return
        if self.source_ids is not None:
            raise RclcError("source_ids: only a message without token_ids carries them (token_ids already name every row)")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype != torch.int64 or ids.shape[0] < 1:
            raise RclcError("token_ids: expected a non-empty int64 vector")
        if bool((ids < -1).any()):
            raise RclcError("token_ids: IDs below -1 are invalid (-1 marks a continuous row)")
        continuous = int((ids == -1).sum())
        if continuous != rows.shape[0]:
            raise RclcError(
                f"token_ids: {continuous} positions are marked -1 but {rows.shape[0]} continuous rows were given"
            )

    def _check_source_ids(self, rows: int) -> None:
        ids = self.source_ids
        if ids is None:
            return
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype != torch.int64 or ids.shape[0] != rows:
            raise RclcError(f"source_ids: expected an int64 vector of {rows} IDs, one per carried row (-1 for a continuous row)")
        if bool((ids < -1).any()):
            raise RclcError("source_ids: IDs below -1 are invalid (-1 marks a continuous row)")

    def receiver_ids(self, weight: torch.Tensor) -> torch.Tensor:
        """The token IDs a receiver with embedding table `weight` may give this message's
        positions: the carried `token_ids` (their rows are rebuilt from them), else
        `source_ids` when every named row is exactly `weight`'s row for its token (a sender of
        another model or dtype would otherwise leave a state whose IDs and rows disagree), else
        -1 for every position."""
        if self.token_ids is not None:
            return self.token_ids.to(weight.device)
        unknown = torch.full((self.positions,), -1, dtype=torch.int64, device=weight.device)
        ids = self.source_ids
        if ids is None or self.continuous_rows.shape[1] != weight.shape[1] or bool((ids >= weight.shape[0]).any()):
            return unknown
        ids = ids.to(weight.device)
        rows = self.continuous_rows.to(device=weight.device, dtype=weight.dtype)
        return ids if rows_match_ids(rows, ids, weight) else unknown

    @property
    def positions(self) -> int:
        """Positions the receiver will prefill."""
        return int(self.continuous_rows.shape[0] if self.token_ids is None else self.token_ids.shape[0])

    @property
    def nbytes(self) -> int:
        """Tensor bytes only (no Python objects, metadata or framing)."""
        size = self.continuous_rows.numel() * self.continuous_rows.element_size()
        ids = self.token_ids if self.token_ids is not None else self.source_ids
        return size + (0 if ids is None else ids.numel() * 8)

    def materialize(self, weight: torch.Tensor) -> torch.Tensor:
        """Rebuild `[positions, hidden]` rows in original order from a matching embedding table."""
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
            raise RclcError("weight: expected a floating [vocab, hidden] embedding table")
        if weight.shape[1] != self.continuous_rows.shape[1]:
            raise IncompatibleStateError(
                f"weight: width {weight.shape[1]} differs from the message rows' width {self.continuous_rows.shape[1]}"
            )
        rows = self.continuous_rows.to(device=weight.device, dtype=weight.dtype)
        if self.token_ids is None:
            return rows
        ids = self.token_ids.to(weight.device)
        if bool((ids >= weight.shape[0]).any()):
            raise IncompatibleStateError(
                f"token_ids: IDs must be below the receiver's vocabulary size {weight.shape[0]}"
            )
        with torch.no_grad():
            out = torch.empty(ids.shape[0], weight.shape[1], dtype=weight.dtype, device=weight.device)
            discrete = ids >= 0
            out[discrete] = weight[ids[discrete]]
            out[~discrete] = rows
        return out


@dataclass(frozen=True, eq=False)
class Delivery:
    """What each receiver of one request gets: the original request and one message per sender."""

    request: Any
    messages: tuple[Message, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.messages, tuple) or not self.messages:
            raise RclcError("messages: a delivery needs at least one message (a tuple in sender order)")

    @property
    def positions(self) -> int:
        """Positions the receiver will prefill for this delivery (all messages)."""
        return sum(message.positions for message in self.messages)

    @property
    def nbytes(self) -> int:
        """Tensor bytes of all messages (see `Message.nbytes`)."""
        return sum(message.nbytes for message in self.messages)

    def rows(self, weight: torch.Tensor) -> torch.Tensor:
        """All messages materialized and concatenated in sender order, `[P, hidden]`."""
        return torch.cat([message.materialize(weight) for message in self.messages], dim=0)

    def for_hf(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """Inputs for an HF forward: the received rows only; the receiver adds its own prompt."""
        rows = self.rows(weight)
        return {
            "inputs_embeds": rows.unsqueeze(0),
            "attention_mask": torch.ones(1, rows.shape[0], dtype=torch.long, device=rows.device),
        }

    def for_vllm(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """`{"prompt_embeds": CPU [P, hidden]}` for an engine started with enable_prompt_embeds=True."""
        parts = []
        for message in self.messages:
            plain = message.token_ids is None and message.continuous_rows.shape[1] == weight.shape[1]
            if plain and weight.is_floating_point():
                parts.append(message.continuous_rows.detach().to(device="cpu", dtype=weight.dtype))
            else:
                parts.append(message.materialize(weight).detach().cpu())
        return {"prompt_embeds": torch.cat(parts, dim=0)}

    def selection_html(self) -> str:
        """A standalone page of every recorded selection in this delivery."""
        selections = [message.selection for message in self.messages]
        if any(selection is None for selection in selections):
            raise RclcError("selection_html: no selection was recorded; transfer with record_selection=True")
        return selection_page(self.request, selections)  # type: ignore[arg-type]
