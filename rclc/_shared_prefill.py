"""Token prompts prefilled from position 0 (a reader's prompt, an agent's history): shared
prefixes computed once, and prompts that arrive together prefilled in one forward (HF).

Why: the prompts agents prefill start alike (the chat template, a system prompt, the
question), and a fan-out's readers, or the readers of concurrent runs, ask for theirs at
the same moment. On a CPU a short prompt's forward costs mostly the reading of the weights
(a 26-token forward of the embedded model takes over half the time of a 64-token one), so
several prompts in one forward, each over the one prefix they share, cost little more than
one of them.

How: `prefill_tokens(model, ids)` queues the prompt; the caller then takes one of the
model's forward slots (`rclc._locks`). Whoever holds a slot first serves every prompt
waiting at that moment (flat combining, `rclc._flat_combining`: no extra thread; where two
forwards at once each get cores of their own, two slot holders share them out), and the
others find their prefill done when they get a slot in turn. A batch is served as:

1. the longest prefix all its prompts share that the model's prefix store
   (`_prefix_cache.py`) holds is taken from it (with sharing on; none otherwise);
2. the prompts' remaining tokens, right-padded to the longest, are forwarded together
   over that prefix. Padding comes after every real token, so causal attention never lets
   a real position see it;
3. every prompt's KV is stored for later prompts.

Exactness, measured (docs/performance.md): a batch of whole prompts (nothing stored), and a
prompt forwarded over a stored prefix (its queries attend over cached keys through an
explicit mask, another kernel path), agree with one causal prefill of each prompt to
float32 rounding, not always bit for bit (on the development CPU 36 and 47 of 48 reader
prompts were bit for bit equal, every selection the same), which is why `shared_prefixes`
and `prefill_batch` can be turned off.

A prompt alone is forwarded over the longest prefix the store has. Long prompts are
forwarded alone (their forward is compute-bound: batching saves nothing). With the model's
`shared_prefixes` off and `prefill_batch` 1, a prompt is prefilled exactly as before, by
one causal forward of its rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ._cache import cache_from_layers, cache_layers, forward_batch, forward_rows, new_cache, prefill
from ._flat_combining import FlatCombiner, Piece
from ._per_object import PerObject
from ._prefix_cache import PrefixCache, SharedPrefix, common_length
from .policy import DEFAULT_PREFILL_BATCH, DEFAULT_PREFIX_CACHE_MIB

Layers = list[tuple[torch.Tensor, torch.Tensor]]

BATCHED_TOKENS = 512
"""A prompt whose uncached part is longer is prefilled alone, and a batch stops growing once
its padded rows would pass this many: beyond it a forward is compute-bound on a CPU."""


@dataclass(frozen=True)
class PrefillOptions:
    """`rclc.Batching`'s prefill options of one model."""

    shared_prefixes: bool = True
    prefix_cache_mib: int = DEFAULT_PREFIX_CACHE_MIB
    prefill_batch: int = DEFAULT_PREFILL_BATCH

    @property
    def plain(self) -> bool:
        """Prefill every prompt alone from its rows, as before either feature existed."""
        return not self.shared_prefixes and self.prefill_batch == 1


@dataclass(eq=False)  # compared by identity
class _Prompt(Piece):
    ids: torch.Tensor  # [n] int64 on the model's device
    options: PrefillOptions


@dataclass
class _Statistics:
    prompts: int = 0
    forwards: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)
    forwarded_positions: int = 0
    reused_positions: int = 0
    padding_positions: int = 0  # rows a batch forwarded only to right-pad a shorter prompt


class SharedPrefill(FlatCombiner[_Prompt]):
    """One model's prefills of token prompts (see the module docs)."""

    cancelled_message = "the caller was cancelled before its prompt was prefilled"

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.options = PrefillOptions()
        self.store = PrefixCache(self.options.prefix_cache_mib << 20)
        self.stats = _Statistics()

    def configure(self, options: PrefillOptions) -> None:
        """New options; a store that shares nothing any more is emptied."""
        with self._lock:
            self.options = options
        self.store.resize(options.prefix_cache_mib << 20 if options.shared_prefixes else 0)

    def prefill(self, model: Any, ids: torch.Tensor) -> Any:
        """A cache of the prompt `ids` (1-D int64 on the model's device) from position 0."""
        options = self.options
        if options.plain:
            return prefill(model, model.get_input_embeddings().weight[ids])
        layers = self.submit(model, _Prompt(ids, options), options.prefill_batch)
        return cache_from_layers(model, layers)

    def fits(self, batch: list[_Prompt], other: _Prompt) -> bool:
        """A long prompt is prefilled alone, and a batch stays within twice `BATCHED_TOKENS` rows."""
        length = int(other.ids.shape[0])
        rows = sum(int(prompt.ids.shape[0]) for prompt in batch)
        return length <= BATCHED_TOKENS and rows + length <= BATCHED_TOKENS * 2

    def compute(self, model: Any, batch: list[_Prompt]) -> list[Layers]:
        """The KV of every prompt of `batch`, stored for later prompts when sharing is on."""
        options = batch[0].options
        ids = [prompt.ids for prompt in batch]
        prefix = self._stored_prefix(ids) if options.shared_prefixes else None
        results = _suffixes(model, ids, prefix)
        reused = 0 if prefix is None else int(prefix[0][0].shape[2])
        lengths = [int(i.shape[0]) for i in ids]
        with self._lock:
            stats = self.stats
            stats.prompts += len(batch)
            stats.forwards += 1
            stats.batch_sizes[len(batch)] = stats.batch_sizes.get(len(batch), 0) + 1
            stats.forwarded_positions += sum(lengths) - len(ids) * reused
            stats.reused_positions += len(ids) * reused
            stats.padding_positions += len(ids) * max(lengths) - sum(lengths)
        if options.shared_prefixes:
            for prompt, layers in zip(batch, results):
                self.store.add(prompt.ids, layers)
        return results

    def _stored_prefix(self, ids: list[torch.Tensor]) -> Layers | None:
        """The longest stored prefix every prompt of a batch starts with (views of its KV).

        What the prompts share beyond it is forwarded once per prompt, in the batch: a
        prefix forwarded alone first would be one more forward, and its KV would differ in
        the last bits from the prompts' own (a batch of whole prompts, right-padded, computes
        each exactly as alone on the CPUs measured)."""
        found = self.common_stored_prefix(ids)
        return None if found is None else found.layers

    def common_stored_prefix(self, ids: list[torch.Tensor]) -> SharedPrefix | None:
        """The longest stored prefix all of `ids` (1-D prompts) start with, leaving each at
        least its last position to forward; None when the store has none that long."""
        length = int(ids[0].shape[0])
        for other in ids[1:]:
            length = min(length, common_length(ids[0], other), int(other.shape[0]))
        return self.store.longest(ids[0][: length + 1] if len(ids) > 1 else ids[0])

    def report(self) -> dict[str, Any]:
        """Options and figures (`rclc.batching_report`'s `prompt_prefills`)."""
        with self._lock:
            stats = self.stats
            figures = {
                "shared_prefixes": self.options.shared_prefixes,
                "prefill_batch": self.options.prefill_batch,
                "prompts": stats.prompts,
                "forwards": stats.forwards,
                "batch_sizes": {str(size): count for size, count in sorted(stats.batch_sizes.items())},
                "forwarded_positions": stats.forwarded_positions,
                "reused_positions": stats.reused_positions,
                "padding_positions": stats.padding_positions,
            }
        return figures | {"prefix_cache": self.store.report()}


def _suffixes(model: Any, ids: list[torch.Tensor], prefix: Layers | None) -> list[Layers]:
    """Forward each prompt's tokens after the `prefix` they share (None: from position 0),
    right-padded to the longest, in one forward; return each prompt's whole KV."""
    start = 0 if prefix is None else int(prefix[0][0].shape[2])
    if len(ids) == 1:
        cache = None if prefix is None else cache_from_layers(model, prefix)
        rows = model.get_input_embeddings().weight[ids[0][start:]].unsqueeze(0)
        _, cache = forward_rows(model, cache, inputs_embeds=rows, start=start)
        return [cache_layers(cache)]
    count = len(ids)
    lengths = [int(i.shape[0]) - start for i in ids]
    width = max(lengths)
    tokens = torch.stack([torch.cat([i[start:], i.new_zeros(width - length)]) for i, length in zip(ids, lengths)])
    if prefix is None:
        cache = new_cache(model)
    else:
        cache = cache_from_layers(model, [(k.expand(count, -1, -1, -1), v.expand(count, -1, -1, -1)) for k, v in prefix])
    positions = torch.arange(start, start + width, device=tokens.device).expand(count, -1)
    forward_batch(model, cache, tokens, positions)
    return [
        [(k[row : row + 1, :, : start + length].clone(), v[row : row + 1, :, : start + length].clone())
         for k, v in cache_layers(cache)]
        for row, length in enumerate(lengths)
    ]


_prefills: PerObject[SharedPrefill] = PerObject(SharedPrefill)


def shared_prefill(model: Any) -> SharedPrefill:
    """The prompt prefills of `model` (made on first use)."""
    return _prefills.get(model)


def existing_shared_prefill(model: Any) -> SharedPrefill | None:
    return _prefills.existing(model)


def prefill_tokens(model: Any, ids: torch.Tensor) -> Any:
    """A DynamicCache of the token prompt `ids` (1-D) from position 0 (see the module docs)."""
    return shared_prefill(model).prefill(model, ids)
