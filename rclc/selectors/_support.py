"""Support moments: the per-layer fold behind CacheBack and QSnap, and the composite score.

For every global layer the fold receives the request rows' post-RoPE queries and the keys
of memory + request. It never materializes more than `ROW_CHUNK` request rows of softmax
at a time and keeps three running length-M vectors (the design spec,
shared/design/rclc_spec.md#42-scoring-support-moments):

    votes[j]      = sum_l (1/(H R)) sum_{head, r} A_l[head, r, j]
    energy[j]     = sum_l sum_h (S * pool7_j((1/R) sum_r Abar_l[h, r, :]))^2
    row_energy[j] = sum_l (1/R) sum_r sum_h (S * pool7_j(Abar_l[h, r, :]))^2

`A` is the float32 softmax over memory + request keys sliced to the memory columns and
`Abar` its mean over the query heads that share one KV head. The arithmetic order is part
of the contract (selections change otherwise): expanded-key matmul in the model dtype,
float32 softmax, slice, group mean before pooling, scale by S before squaring.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F

from ..errors import CaptureError
from ..state import SenderState
from ._shared_capture import shared_capture

ROW_CHUNK = 256
MOMENT_SCALE = 256.0
POOL_WINDOW = 7
TINY = torch.finfo(torch.float32).tiny


def pool7(values: torch.Tensor) -> torch.Tensor:
    """Centred max pool of width 7 along the last axis; out-of-range neighbours are ignored."""
    if values.dim() == 1:
        return F.max_pool1d(values.unsqueeze(0), POOL_WINDOW, 1, POOL_WINDOW // 2).squeeze(0)
    if values.dim() in (2, 3):
        return F.max_pool1d(values, POOL_WINDOW, 1, POOL_WINDOW // 2)
    flat = values.reshape(-1, 1, values.shape[-1])
    return F.max_pool1d(flat, POOL_WINDOW, 1, POOL_WINDOW // 2).reshape(values.shape)


class SupportFold:
    """Accumulates votes (and, with `moments`, energy and row energy) over global layers."""

    def __init__(self, *, moments: bool = True) -> None:
        self.moments = moments
        self.layers = 0
        self.heads = 0
        self.rows = 0
        self.votes: torch.Tensor | None = None
        self.energy: torch.Tensor | None = None
        self.row_energy: torch.Tensor | None = None
        self._masks: dict[tuple[int, int, int, torch.device], torch.Tensor] = {}

    def __call__(self, query: torch.Tensor, key: torch.Tensor, scaling: float) -> None:
        self._fold(query, key, scaling, None)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
        """Fold one global layer and return its attention output `[1, rows, H, d]` (the
        layout transformers' attention functions return), computed from the very softmax
        the fold takes: the capture's forward then runs each global layer's attention once
        instead of twice (the model's kernel for the output, the fold's for the scores).
        The output agrees with the model's kernel to float32 rounding."""
        output = self._fold(query, key, scaling, value)
        assert output is not None
        return output

    def _fold(
        self, query: torch.Tensor, key: torch.Tensor, scaling: float, value: torch.Tensor | None
    ) -> torch.Tensor | None:
        _, heads, rows, head_dim = query.shape
        kv_heads, total = key.shape[1], key.shape[2]
        group = heads // kv_heads
        memory = total - rows
        device = query.device
        if self.votes is None:
            self.heads, self.rows = heads, rows
            self.votes = torch.zeros(memory, dtype=torch.float32, device=device)
            if self.moments:
                self.energy = torch.zeros(memory, dtype=torch.float32, device=device)
                self.row_energy = torch.zeros(memory, dtype=torch.float32, device=device)
        # Grouped matmul: the g query heads of one KV head are stacked as rows of one matrix,
        # so every logit is the same d-long dot product as with keys repeated to all heads
        # (checked bit for bit in the tests) without materializing the repeated keys.
        # `torch.bmm` directly: `torch.matmul` takes a slower path for a transposed batch.
        keys_t = key[0].transpose(-1, -2)  # [K, d, M+R], model dtype
        row_sum = torch.zeros(kv_heads, memory, dtype=torch.float32, device=device) if self.moments else None
        row_acc = torch.zeros(memory, dtype=torch.float32, device=device) if self.moments else None
        output = None if value is None else query.new_empty(heads, rows, value.shape[-1])
        for start in range(0, rows, ROW_CHUNK):
            stop = min(start + ROW_CHUNK, rows)
            count = stop - start
            stacked = query[0, :, start:stop].reshape(kv_heads, group * count, head_dim)
            logits = torch.bmm(stacked, keys_t).view(heads, count, total).mul_(scaling)  # [H, c, M+R]
            logits[..., memory:].masked_fill_(self._hidden(start, count, rows, device), float("-inf"))
            weights = torch.softmax(logits.float(), dim=-1)  # [H, c, M+R]
            if output is not None:  # the layer's output from the same weights, per KV head
                mixed = torch.bmm(weights.to(value.dtype).view(kv_heads, group * count, total), value[0])
                output[:, start:stop] = mixed.view(heads, count, -1)
            attention = weights[..., :memory]  # [H, c, M]
            self.votes += attention.sum(dim=(0, 1))
            if not self.moments:
                continue
            grouped = attention.unflatten(0, (kv_heads, group)).mean(1)  # [K, c, M]
            row_sum += grouped.sum(1)
            row_acc += pool7(grouped).mul_(MOMENT_SCALE).square_().sum(dim=(0, 1))
        if self.moments:
            self.energy += (MOMENT_SCALE * pool7(row_sum / rows)).square().sum(0)
            self.row_energy += row_acc / rows
        self.layers += 1
        return None if output is None else output.transpose(0, 1).unsqueeze(0).contiguous()

    def _hidden(self, start: int, count: int, rows: int, device: torch.device) -> torch.Tensor:
        """Request keys a chunk's rows may not see (key c hidden from row r when c > r), reused across layers."""
        key = (start, count, rows, device)
        mask = self._masks.get(key)
        if mask is None:
            mask = torch.ones(count, rows, dtype=torch.bool, device=device).triu(start + 1)
            self._masks[key] = mask
        return mask

    def votes_mean(self) -> torch.Tensor:
        if self.votes is None or self.layers == 0:
            raise CaptureError("attention capture: no global layer was folded, so no scores were collected")
        return self.votes / (self.heads * self.rows)


Offer = tuple[SenderState, torch.Tensor, SupportFold]

_offered: ContextVar[tuple[Offer, ...]] = ContextVar("rclc_offered_folds", default=())


def request_fold(sender: SenderState, request_ids: torch.Tensor, *, moments: bool) -> SupportFold:
    """Forward the request over a private view of the sender's cache, folding every global
    layer; or hand back the fold `offering` holds for this very sender and request."""
    for state, ids, fold in _offered.get():
        if state is sender and (fold.moments or not moments) and ids.shape == request_ids.shape and torch.equal(ids, request_ids):
            return fold
    return request_folds([sender], [request_ids], moments=moments)[0]


def request_folds(
    senders: Sequence[SenderState], request_ids: Sequence[torch.Tensor], *, moments: bool = True
) -> list[SupportFold]:
    """`request_fold` of several senders (by default with moments, which also serve QSnap's
    votes): one batched capture per model they share (a fan-in's requests cost one forward
    instead of one each), folded together with other transfers' captures that wait for the
    model at the same moment (`_shared_capture`)."""
    found: dict[int, SupportFold] = {}
    groups: dict[int, list[int]] = {}
    for index, sender in enumerate(senders):
        groups.setdefault(id(sender.model), []).append(index)
    for indices in groups.values():
        model = senders[indices[0]].model
        captured = shared_capture(model).folds(
            model,
            [(senders[i].past_key_values, senders[i].positions, request_ids[i]) for i in indices],
            lambda: SupportFold(moments=moments),
        )
        found.update(zip(indices, captured))
    return [found[index] for index in range(len(senders))]


@contextmanager
def offering(offers: Sequence[Offer]) -> Iterator[None]:
    """Within the block (this context only), `request_fold` of an offered sender and request
    returns the offered fold instead of capturing again."""
    token = _offered.set(_offered.get() + tuple(offers))
    try:
        yield
    finally:
        _offered.reset(token)


def correction(row_energy: torch.Tensor, energy: torch.Tensor) -> torch.Tensor:
    """`ratio = max(row_energy / max(energy, tiny), tiny)`, 1 where both moments are 0."""
    ratio = torch.clamp(row_energy / torch.clamp(energy, min=TINY), min=TINY)
    neutral = (row_energy == 0) & (energy == 0)
    return torch.where(neutral, torch.ones_like(ratio), ratio)


def composite_score(fold: SupportFold) -> torch.Tensor:
    """CacheBack's score: `pool7(votes_mean) * ratio ** 2` (squared support correction)."""
    votes = fold.votes_mean()
    if fold.energy is None or fold.row_energy is None:
        raise CaptureError("attention capture: support moments were not collected")
    return pool7(votes) * correction(fold.row_energy, fold.energy) ** 2
