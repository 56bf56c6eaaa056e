"""The batching engine's KV store (every decoding sequence's cache in one left-padded
buffer) and the two forwards over it: a prompt's prefill alone, a batched decode step.

Why our own buffer and not a list of `DynamicCache`s or transformers' own caches:

- a batched forward needs one `[batch, kv_heads, positions, head_dim]` tensor per layer;
  sequences of different lengths are right-aligned in it (left padding, masked out), so
  every sequence writes its next position into the same column;
- `DynamicCache` appends by concatenation, which copies the whole cache at every step
  (measured: about 40 % of a 32-sequence decode step on the embedded model); here the
  buffer has room for the next `ROOM_STEP` tokens (or fewer, when no sequence needs more)
  and a step writes one column in place, so the buffer is copied once per `ROOM_STEP`
  steps at most, and never holds room for tokens an early end of sequence makes unneeded;
- transformers' `StaticCache` has one length for the whole batch and its paged cache
  (continuous batching) takes token IDs only and switches the model's attention
  implementation process-wide (see docs/performance.md).

Layout per layer: keys and values `[rows capacity, kv_heads, columns capacity, head_dim]`.
Live columns are `[start, end)`; row `r` of length `n` holds its positions in
`[end - n, end)` and zeros before them (zeros, never stale values: a masked score is only
exact when the key it masks is finite). Joining a longer sequence moves `start` left (or
reallocates), a sequence leaving moves the last row into its slot, and `start` moves right
when every row has left padding in front, so attention only spans the longest live row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .._cache import backbone, cache_from_layers, cache_layers
from ..errors import IncompatibleStateError

ROOM_STEP = 64
"""Columns a (re)allocation leaves free after the live window, at most."""


class _StepLayer(DynamicLayer):
    """One layer of the store as the model sees it during one forward over rows
    `[low, high)`: writes the new positions in place at column `end` and returns the live
    window of those rows (two forwards over disjoint rows may run at once)."""

    def __init__(self, store: BatchCache, index: int, low: int, high: int) -> None:
        super().__init__()
        self.store, self.index, self.low, self.high = store, index, low, high
        self.is_initialized = True
        self.device = store.keys[index].device
        self.keys, self.values = store.window(index, 0, low, high)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        store, count = self.store, key_states.shape[-2]
        low, high, end = self.low, self.high, store.end
        store.keys[self.index][low:high, :, end : end + count] = key_states
        store.values[self.index][low:high, :, end : end + count] = value_states
        self.keys, self.values = store.window(self.index, count, low, high)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.store.end - self.store.start

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0


class BatchCache:
    """The left-padded KV buffer of the sequences decoding together (engine thread only)."""

    def __init__(self, layers: int) -> None:
        self.layer_count = layers
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []  # positions each row holds
        self.start = self.end = 0

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return self.end - self.start

    def window(self, layer: int, extra: int, low: int = 0, high: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `[low, high)` (default: every row) of the live columns and `extra` more."""
        high, stop = self.rows if high is None else high, self.end + extra
        return self.keys[layer][low:high, :, self.start : stop], self.values[layer][low:high, :, self.start : stop]

    # -- shape management --------------------------------------------------------------

    def _allocate(self, rows: int, left: int, right: int, template: torch.Tensor) -> None:
        """New zeroed buffers with room for `rows` rows: `left` free columns, then the live
        window (copied), then `right` free columns."""
        width = self.width
        columns = left + width + right
        keys, values = [], []
        for index in range(self.layer_count):
            old_k = self.keys[index] if self.keys else None
            shape = (rows, template.shape[1], columns, template.shape[3])
            new_k = torch.zeros(shape, dtype=template.dtype, device=template.device)
            new_v = torch.zeros(shape, dtype=template.dtype, device=template.device)
            if old_k is not None and self.rows and width:
                new_k[: self.rows, :, left : left + width] = old_k[: self.rows, :, self.start : self.end]
                new_v[: self.rows, :, left : left + width] = self.values[index][: self.rows, :, self.start : self.end]
            keys.append(new_k)
            values.append(new_v)
        self.keys, self.values = keys, values
        self.start, self.end = left, left + width

    def reserve(self, row_capacity: int, length: int, right_room: int, template: torch.Tensor) -> None:
        """Room for one more row of `length` positions; when that takes a reallocation, it
        leaves `right_room` columns free after `end` (otherwise `grow` adds them as needed)."""
        have_rows = self.keys[0].shape[0] if self.keys else 0
        have_columns = self.keys[0].shape[2] if self.keys else 0
        left_needed = max(0, length - self.width)
        if (
            self.keys
            and have_rows > self.rows
            and self.start >= left_needed
            and have_columns - self.end >= 1
        ):
            if left_needed:
                new_start = self.start - left_needed
                for index in range(self.layer_count):  # columns trimmed earlier may hold stale rows
                    self.keys[index][: self.rows, :, new_start : self.start] = 0
                    self.values[index][: self.rows, :, new_start : self.start] = 0
                self.start = new_start
            return
        rows = max(min(row_capacity, max(2 * have_rows, 4)), self.rows + 1)
        self._allocate(rows, left_needed, right_room, template)
        self.start -= left_needed

    # -- sequences joining and leaving ---------------------------------------------------

    def join(self, layers: list[tuple[torch.Tensor, torch.Tensor]], right_room: int, row_capacity: int) -> int:
        """Copy one sequence's `[1, kv_heads, n, head_dim]` KV per layer in; return its row.
        `right_room`: the columns the batch may still need after `end` (at most `ROOM_STEP`
        are reserved; `grow` adds more when they are used up)."""
        if len(layers) != self.layer_count:
            raise IncompatibleStateError(f"cache: expected {self.layer_count} layers, got {len(layers)}")
        length = int(layers[0][0].shape[2])
        self.reserve(row_capacity, length, max(1, min(right_room, ROOM_STEP)), layers[0][0])
        row = self.rows
        first = self.end - length
        for index, (keys, values) in enumerate(layers):
            self.keys[index][row, :, self.start : first] = 0
            self.values[index][row, :, self.start : first] = 0
            self.keys[index][row, :, first : self.end] = keys[0]
            self.values[index][row, :, first : self.end] = values[0]
        self.lengths.append(length)
        return row

    def extract(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Private copies of row `row`'s KV, `[1, kv_heads, n, head_dim]` per layer."""
        first = self.end - self.lengths[row]
        return [
            (k[row : row + 1, :, first : self.end].clone(), v[row : row + 1, :, first : self.end].clone())
            for k, v in zip(self.keys, self.values)
        ]

    def remove(self, row: int) -> int | None:
        """Drop row `row`; the last row moves into its slot. Returns the row that moved (its
        old index), or None when `row` was the last."""
        last = self.rows - 1
        moved = None
        if row != last:
            for keys, values in zip(self.keys, self.values):
                keys[row, :, self.start : self.end] = keys[last, :, self.start : self.end]
                values[row, :, self.start : self.end] = values[last, :, self.start : self.end]
            self.lengths[row] = self.lengths[last]
            moved = last
        self.lengths.pop()
        if not self.lengths:
            self.start = self.end = 0
            self.keys, self.values = [], []  # an idle engine holds no KV memory
        else:
            self.start = self.end - max(self.lengths)  # columns every row pads are no longer attended
        return moved

    # -- one decode step -----------------------------------------------------------------

    def room(self) -> int:
        """Columns free after `end`."""
        return (self.keys[0].shape[2] - self.end) if self.keys else 0

    def grow(self, right_room: int) -> None:
        """Make sure one column is free after `end`; reallocating, leave `right_room` free
        (the columns the batch's sequences may still need, at most `ROOM_STEP`)."""
        if self.room() < 1:
            self._allocate(self.keys[0].shape[0], 0, max(1, min(right_room, ROOM_STEP)), self.keys[0])

    def attention_mask(self, device: torch.device, low: int = 0, high: int | None = None) -> torch.Tensor:
        """`[rows, width + 1]` for rows `[low, high)`: 1 where a row holds a position (and for
        the new one), 0 on padding."""
        width = self.width
        lengths = torch.tensor(self.lengths[low:high], device=device).unsqueeze(1)
        columns = torch.arange(width + 1, device=device).unsqueeze(0)
        return (columns >= width - lengths).to(torch.long)

    def cache(self, config: Any, low: int = 0, high: int | None = None) -> Any:
        """A transformers Cache whose layers write into rows `[low, high)` of this store (for one forward)."""
        high = self.rows if high is None else high
        cache = DynamicCache(config=config)
        cache.layers = [_StepLayer(self, index, low, high) for index in range(self.layer_count)]
        return cache

    def advance(self) -> None:
        """After a successful step: every row holds one more position."""
        self.end += 1
        self.lengths = [length + 1 for length in self.lengths]


def prefill(
    model: Any,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """One prompt (`input_ids [1, n]` or `inputs_embeds [1, n, hidden]`) forwarded alone, as
    `generate` forwards it: (its last position's `[vocab]` float32 logits, its KV per layer).

    With `past` (the KV of the prompt's first `p < n` positions, a retained state's cache)
    only positions `p..n-1` are forwarded, over a view of it: the cache grows by
    concatenation, so the caller's tensors are never written.
    """
    prompt = inputs_embeds if inputs_embeds is not None else input_ids
    length = int(prompt.shape[1])
    start = 0 if past is None else int(past[0][0].shape[2])
    cache = DynamicCache(config=model.config) if past is None else cache_from_layers(model, past)
    arguments = (
        {"inputs_embeds": inputs_embeds[:, start:]} if inputs_embeds is not None else {"input_ids": input_ids[:, start:]}
    )
    output = model(
        **arguments,
        attention_mask=torch.ones(1, length, dtype=torch.long, device=prompt.device),
        position_ids=torch.arange(start, length, device=prompt.device).unsqueeze(0),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return output.logits[0, -1].to(dtype=torch.float32), cache_layers(cache)


def prefill_many(
    model: Any, prompts: list[torch.Tensor], past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
) -> list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Several prompts forwarded together, right-padded to the longest: per prompt, its last
    position's `[vocab]` float32 logits and its KV per layer (`[1, kv_heads, n, head_dim]`,
    private copies). `prompts` are `[n_i, hidden]` input rows after `past`, the KV
    (`[1, kv_heads, p, head_dim]` per layer) of a prefix every prompt starts with (None: the
    prompts start at position 0); each prompt's KV then holds the prefix too.

    Padding sits after every real position, so causal attention never lets a real position
    see it and no padding mask is needed: each prompt gets what its own forward computes, up
    to the rounding of batched matmuls (docs/performance.md measures it)."""
    count, width = len(prompts), max(int(rows.shape[0]) for rows in prompts)
    start = 0 if past is None else int(past[0][0].shape[2])
    first = prompts[0]
    rows = first.new_zeros(count, width, first.shape[1])
    for index, prompt in enumerate(prompts):
        rows[index, : prompt.shape[0]] = prompt
    if past is None:
        cache = DynamicCache(config=model.config)
    else:
        cache = cache_from_layers(model, [(k.expand(count, -1, -1, -1), v.expand(count, -1, -1, -1)) for k, v in past])
    output = backbone(model)(
        inputs_embeds=rows,
        attention_mask=torch.ones(count, start + width, dtype=torch.long, device=rows.device),
        position_ids=torch.arange(start, start + width, device=rows.device).expand(count, -1),
        cache=cache,
        use_cache=True,
    )
    lengths = [int(prompt.shape[0]) for prompt in prompts]
    last = output.last_hidden_state[torch.arange(count, device=rows.device), torch.tensor(lengths, device=rows.device) - 1]
    logits = model.get_output_embeddings()(last).to(dtype=torch.float32)  # [count, vocab]
    layers = cache_layers(cache)
    return [
        (logits[index], [(k[index : index + 1, :, : start + length].clone(),
                          v[index : index + 1, :, : start + length].clone()) for k, v in layers])
        for index, length in enumerate(lengths)
    ]


Beside = Callable[[Callable[[], Any]], Callable[[], Any]]
"""Starts a forward in another thread and returns what waits for its result (`side_by_side`)."""


def side_by_side(beside: Beside, first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Any, Any]:
    """`first` in this thread while `beside` runs `second` in another; both results. The
    second is joined even when the first fails: both write into shared state (a store's
    rows, a model's activations), which must not change after this returns."""
    waiting = beside(second)
    try:
        found = first()
    finally:
        rest = waiting()
    return found, rest


def decode_step(
    model: Any, store: BatchCache, tokens: list[int], right_room: int = ROOM_STEP, *, logits: bool = True,
    beside: Beside | None = None,
) -> torch.Tensor | None:
    """Forward each row's last token (`tokens[row]`) at its next position in one batched
    forward; the store then holds one more position per row. Returns `[rows, vocab]` float32,
    or None with `logits=False` (a step that only writes the tokens' KV runs the decoder stack
    without the LM head). `right_room`: the columns the rows may still need (sizes a
    reallocation). With `beside`, the rows' second half is forwarded by it (another thread,
    on a core of its own) while this thread forwards the first: two half forwards side by
    side, each reading the weights, beat one forward of every row once a step is
    compute-bound (docs/performance.md); each row's arithmetic is its own either way, up to
    the rounding of a batched matmul of another size."""
    store.grow(right_room)
    if beside is None:
        found = _decode_rows(model, store, tokens, 0, store.rows, logits)
    else:
        half = store.rows // 2
        first, rest = side_by_side(beside, lambda: _decode_rows(model, store, tokens, 0, half, logits),
                                   lambda: _decode_rows(model, store, tokens, half, store.rows, logits))
        found = None if first is None or rest is None else torch.cat([first, rest])
    store.advance()
    return found


def _decode_rows(model: Any, store: BatchCache, tokens: list[int], low: int, high: int, logits: bool) -> torch.Tensor | None:
    """One decode forward of rows `[low, high)`, writing their new KV column in place."""
    device = store.keys[0].device
    arguments = {
        "input_ids": torch.tensor([[token] for token in tokens[low:high]], device=device),
        "attention_mask": store.attention_mask(device, low, high),
        "position_ids": torch.tensor(store.lengths[low:high], device=device).unsqueeze(1),
        "cache": store.cache(model.config, low, high),
        "use_cache": True,
    }
    if not logits:
        backbone(model)(**arguments)
        return None
    output = model(**arguments, logits_to_keep=1)
    return output.logits[:, -1].to(dtype=torch.float32)
