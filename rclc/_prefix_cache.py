"""Shared prompt prefixes, computed once: the KV of token prompts a model prefilled, reused by
later prompts that start with the same token IDs (HF models).

Why: the agents of one run, and of concurrent runs, prefill prompts that start alike (the
chat template, a system prompt, the question: the readers of a fan-out share the first
~40 of ~65 tokens). A causal model's KV at position i depends only on the tokens up to i,
so the KV of a prompt's first k positions is the KV of any other prompt with the same
first k token IDs, and only the rest needs a forward.

What is stored: per model, the KV of whole prompts as their prefill made them (`add`),
most recently used first, up to `max_bytes` in all. A lookup (`longest`) finds the stored
prompt sharing the longest run of leading token IDs with the new one and hands back a view
of that many positions (at least `MIN_SHARED` of them, and never the whole prompt: its
last position is always forwarded, so its logits and its own KV come from this prompt's
forward). Entries alias the prefill's own tensors, which nothing writes in place (rclc
extends caches by concatenation into new tensors), so a stored prompt costs memory only
once its agent has dropped it.

Not bit for bit: the suffix forwarded over a reused prefix runs in other matmul and
attention shapes than one causal prefill of the whole prompt. On the development CPU the
two agreed bit for bit in 47 of 48 reader prompts measured and to 5.7e-6 in the other, with
the same selections (docs/performance.md); in general they agree to float32 rounding, so a
greedy token whose two best logits are that close, or a selector's tie, may go the other
way. `rclc.configure_batching(model, shared_prefixes=False)` turns
reuse off (and empties the store): prefills are then exactly what they were without it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from ._per_object import PerObject

Layers = list[tuple[torch.Tensor, torch.Tensor]]

MIN_SHARED = 16
"""Leading tokens a reuse must share at least: a shorter prefix saves less than it costs."""


@dataclass(frozen=True)
class SharedPrefix:
    """`length` leading positions of a stored prompt, as views of its KV per layer."""

    length: int
    layers: Layers


@dataclass
class _Entry:
    ids: torch.Tensor  # [n] int64, CPU
    layers: Layers
    nbytes: int


def _bytes(layers: Layers) -> int:
    return sum(k.untyped_storage().nbytes() + v.untyped_storage().nbytes() for k, v in layers)


def common_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading IDs `a` and `b` (1-D) share."""
    n = min(int(a.shape[0]), int(b.shape[0]))
    if n == 0:
        return 0
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if differ.numel() else n


class PrefixCache:
    """The stored prompts of one model (see the module docs); safe to use from any thread."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # most recently used last
        self._lock = threading.Lock()
        self._serial = 0
        self.hits = self.misses = self.reused_positions = 0

    def resize(self, max_bytes: int) -> None:
        """A new budget; entries beyond it are dropped (0 drops them all)."""
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def longest(self, ids: torch.Tensor) -> SharedPrefix | None:
        """The longest stored prefix of `ids` (1-D), at most `len(ids) - 1` positions and at
        least `MIN_SHARED`; None when no stored prompt shares that many."""
        ids = ids.detach().to("cpu")
        limit = int(ids.shape[0]) - 1
        best_key, best = None, 0
        with self._lock:
            for key, entry in self._entries.items():
                shared = min(common_length(entry.ids, ids), limit)
                if shared > best:
                    best_key, best = key, shared
            if best_key is None or best < MIN_SHARED:
                self.misses += 1
                return None
            entry = self._entries[best_key]
            self._entries.move_to_end(best_key)
            self.hits += 1
            self.reused_positions += best
            layers = [(k[..., :best, :], v[..., :best, :]) for k, v in entry.layers]
        return SharedPrefix(best, layers)

    def add(self, ids: torch.Tensor, layers: Layers) -> None:
        """Store the KV `layers` (`[1, kv_heads, n, head_dim]` per layer) of the prompt `ids`
        (1-D, n IDs). A prompt another entry already starts with is not stored again, and an
        entry this prompt starts with is replaced by it."""
        ids = ids.detach().to("cpu")
        length = int(ids.shape[0])
        if length < MIN_SHARED + 1 or not layers or int(layers[0][0].shape[2]) != length:
            return
        size = _bytes(layers)
        with self._lock:
            if size > self.max_bytes:
                return
            for key, entry in list(self._entries.items()):
                shared = common_length(entry.ids, ids)
                if shared == length:  # already covered by a longer (or equal) prompt
                    self._entries.move_to_end(key)
                    return
                if shared == int(entry.ids.shape[0]):  # this prompt extends the entry
                    del self._entries[key]
            self._serial += 1
            self._entries[self._serial] = _Entry(ids.clone(), list(layers), size)
            self._evict()

    def _evict(self) -> None:
        total = sum(entry.nbytes for entry in self._entries.values())
        while self._entries and total > self.max_bytes:
            _, entry = self._entries.popitem(last=False)
            total -= entry.nbytes

    def report(self) -> dict[str, Any]:
        """What the store holds and did (`rclc.batching_report`'s `prefix_cache`)."""
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": sum(entry.nbytes for entry in self._entries.values()),
                "max_bytes": self.max_bytes,
                "hits": self.hits,
                "misses": self.misses,
                "reused_positions": self.reused_positions,
            }


_caches: PerObject[PrefixCache] = PerObject(lambda model: PrefixCache(0))


def prefix_cache(model: Any) -> PrefixCache:
    """The prefix store of `model` (made on first use; `configure_batching` sizes it)."""
    return _caches.get(model)


def existing_prefix_cache(model: Any) -> PrefixCache | None:
    return _caches.existing(model)
